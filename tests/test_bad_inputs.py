"""Bad input, as a new user types it, at every front door (issue 35 item 4).

One row per mistake: the command line, the exit status it must end with, and the phrase of the
message that says what to change. Every row also asserts that no traceback is printed. The rows
were found by running each command as a reader would; each one either failed (a traceback, a
silent wrong answer, exit 0) before ``servebook.validation`` or guards a rule the message names.

``{tmp}`` in a row is a folder of bad files made by the ``bad_files`` fixture. Status 2 is an
error (``servebook.cli.main``), 1 a drill answer graded wrong, 0 a drill answer graded right.
Rows run in-process through ``servebook.cli.main``; two run as real processes (a closed pipe,
and a seed numpy used to refuse with a traceback).
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import servebook
from servebook import live
from servebook.cli import main
from servebook.shipped import MODELS_DIR

FLEET = "fleet --config llama-3.1-8b --gpu h200 --gpus 1 --requests 10 --input-tokens 100 --output-tokens 100"
STEP = "step --config llama-3.1-8b --gpu h200"
DECODE = STEP + " --phase decode --batch 1 --context 10"
SIM = "simulate --requests 5"
PERF = "simulate --requests 5 --config llama-3.1-8b --gpu h200"
TUNE = "tune --config llama-3.1-8b --gpu h200 --gpus 1 --rate 2 --input-tokens 100 --output-tokens 50"
RUN = "batch run {tmp}/two.jsonl -o {tmp}/out.jsonl --model never-loaded"

# (command line, exit status, phrase that says what to change)
CASES = [
    # -- plan -------------------------------------------------------------------------------------
    ('plan --config llama-3.1-8b --gpu ""', 2, "--gpu '' is empty: give a GPU name from the catalogue"),
    ("plan --config llama-3.1-8b --gpu h300", 2, "unknown GPU 'h300'; known GPUs: H100-SXM-80GB"),
    # An H200 holds 150,109,880,320 bytes = 139.80 GiB (gpus.toml): 1e9 GiB cannot be one GPU's KV cache.
    ("plan --config llama-3.1-8b --available-kv-gib 1e9", 2, "at most 139.80 GiB"),
    ("plan --config llama-3.1-8b --gpu h200 --tp 2 --available-kv-gib 200", 2, "gives the KV cache per GPU"),
    ("plan --config llama-3.1-8b --available-kv-gib nan", 2, "--available-kv-gib nan is not allowed"),
    ("plan --config llama-3.1-8b --available-kv-gib -1", 2, "use a positive number of GiB"),
    ("plan --config llama-3.1-8b --tp 3", 2, "use one of [1, 2, 4, 8, 16, 32] for --tp"),
    ("plan --config llama-3.1-8b --tp 0", 2, "--tp 0 is not allowed: it is the tensor-parallel size"),
    ("plan --config llama-3.1-8b --max-model-len 999999", 2, "use a value in [1, 131072]"),
    ("plan --config llama-3.1-8b --max-model-len 0", 2, "--max-model-len 0 is not allowed"),
    ("plan --config llama-3.1-8b --gpu-memory-utilization 1.5", 2, "a fraction in (0, 1]"),
    ("plan --config llama-3.1-8b --gpu-memory-utilization nan", 2, "a fraction in (0, 1]"),
    ("plan --config llama-3.1-8b --block-size 7", 2, "--block-size 7 is not allowed"),
    ("plan --config llama-3.1-8b --block-size 2048", 2, "a multiple of 16 between 16 and 1024"),
    ("plan --config llama-3.1-8b --request-tokens 0", 2, "--request-tokens 0 is not allowed"),
    ("plan --config llama-3.1-8b --max-model-len 4096 --request-tokens 5000", 2, "use at most 4096"),
    ("plan --config llama-3.1-8b --kv-cache-dtype fp4", 2, "invalid choice: 'fp4'"),
    ("plan --config llama-3.1-8b --tp two", 2, "invalid int value: 'two'"),
    ('plan --config ""', 2, "--config is empty; give a reference id"),
    ("plan --config {tmp}/kv5.json", 2, "fix num_key_value_heads (a divisor of 32"),
    ("plan --config {tmp}/no-config", 2, "holds no config.json"),
    ("plan --config {tmp}/not-json.json", 2, "is not valid JSON"),
    ("plan --config llama-3.1-8", 2, "reference ids: deepseek-v2-lite"),
    ("plan --config {tmp}/weights.safetensors", 2, "point at the model's config.json, not its weights"),
    ("plan --config llama-3.1-8b --gpu 'NVIDIA H100 80GB HBM3'", 2, "aliases such as 'H100'"),
    # -- tune -------------------------------------------------------------------------------------
    (TUNE + " --ttft-ms 500 --gpu h300", 2, "unknown GPU 'h300'"),
    (TUNE, 2, "give at least one target: --ttft-ms, --tpot-ms or --e2e-s"),
    (TUNE + " --tpot-ms 40 --tp a,b", 2, "--tp takes comma-separated integers"),
    (TUNE + " --tpot-ms 40 --rate 0", 2, "--rate 0 is not allowed: it is the arrival rate in requests/s"),
    (TUNE + " --tpot-ms 40 --output-tokens 1", 2, "must be >= 2 (TPOT needs two tokens)"),
    (TUNE + " --tpot-ms 40 --range-ratio 1.5", 2, "--range-ratio must be in [0, 1)"),
    (TUNE + " --tpot-ms -4", 2, "--tpot-ms -4 is not allowed: it is the time-per-output-token target in ms and must be > 0"),
    (TUNE + " --tpot-ms 40 --gpus 0", 2, "--gpus 0 is not allowed: it is the most GPUs the deployment may use"),
    (TUNE + " --tpot-ms 40 --kv-cache-dtypes fp4", 2, "--kv-cache-dtypes 'fp4' is not supported"),
    (TUNE + " --tpot-ms 40 --prefix-tokens 20 --prefix-share 1.2", 2, "--prefix-share must be a fraction of requests in [0, 1]"),
    (TUNE + " --tpot-ms 40 --prefix-tokens 100", 2, "--prefix-tokens must be in [0, input tokens), got 100"),
    (TUNE + " --tpot-ms 40 --speculative ngram:k=0,alpha=0.5", 2, "--speculative needs k >= 1 draft tokens per step"),
    (TUNE + " --tpot-ms 40 --speculative ngram:k=4,alpha=2", 2, "alpha is a per-token acceptance probability in [0, 1]"),
    (TUNE + " --tpot-ms 40 --speculative eagle:k=4,alpha=0.5", 2, "method 'eagle' is not priced here"),
    (TUNE + " --tpot-ms 40 --ttft-ms nan", 2, "--ttft-ms nan is not allowed: it is the time-to-first-token target in ms and must be a finite number"),
    # -- fleet ------------------------------------------------------------------------------------
    (FLEET + " --calibration {tmp}/brace.json", 2, "is not valid JSON"),
    (FLEET + " --calibration {tmp}/list.json", 2, 'holds a JSON list, not an object with "coefficients"'),
    (FLEET + " --calibration {tmp}/object.json", 2, 'has no "coefficients" object'),
    (FLEET + " --calibration {tmp}", 2, "is a directory; point --calibration at a calibration record"),
    (FLEET + " --calibration {tmp}/text-coefficients.json", 2, "are not numbers: step_overhead_s"),
    (FLEET + " --calibration {tmp}/unknown-gpu.json", 2, "GPU 'Z9000', which is not in the catalogue"),
    (FLEET + " --calibration {tmp}/missing.json", 2, "no step-time calibration at"),
    (FLEET + ' --gpu ""', 2, "--gpu '' is empty"),
    (FLEET + " --spec-k 2 --spec-alpha 1.5", 2, "--spec-alpha 1.5 is not allowed"),
    (FLEET + " --spec-alpha 0.5", 2, "add --spec-k K"),
    (FLEET + " --gpus 3 --tp 2", 2, "use a multiple of 2"),
    (FLEET + " --tp 3", 2, "use one of [1, 2, 4, 8, 16, 32] for --tp"),
    (FLEET + " --input-tokens nan", 2, "--input-tokens nan is not allowed"),
    (FLEET + " --output-tokens inf", 2, "must be a finite number"),
    (FLEET + " --input-cv nan --input-tokens 100", 2, "--input-cv nan is not allowed"),
    (FLEET + " --price-per-gpu-hour nan", 2, "--price-per-gpu-hour nan is not allowed"),
    (FLEET + " --max-num-batched-tokens 512", 2, "raise --max-num-batched-tokens to at least 1024"),
    (FLEET + " --batch 2000", 2, "is more than --max-num-seqs 1024"),
    (FLEET + " --kv-cache-dtype fp4", 2, "--kv-cache-dtype 'fp4' is not supported"),
    (FLEET + " --gpu-memory-utilization 0", 2, "a fraction in (0, 1]"),
    (FLEET + " --cudagraph-max-tokens 0", 2, "--cudagraph-max-tokens 0 is not allowed"),
    (FLEET + ' --spec-k 2 --spec-alpha 0.5 --draft-config ""', 2, "--draft-config is empty"),
    ('fleet --compare-draft --gpu ""', 2, "--gpu '' is empty"),
    ("fleet --compare-draft --calibration {tmp}/list.json", 2, "holds a JSON list"),
    ("fleet --compare-draft --config llama-3.1-8b --gpus 8", 2, "ignores --config, --gpus; drop --compare-draft"),
    ("fleet --config llama-3.1-8b --gpu h200 --requests 10 --input-tokens 100 --output-tokens 100", 2,
     "servebook fleet needs --gpus"),
    # -- step -------------------------------------------------------------------------------------
    ('step --config llama-3.1-8b --gpu "" --phase decode --batch 1 --context 10', 2, "--gpu '' is empty"),
    (DECODE + " --cudagraph-max-tokens 0", 2, "--cudagraph-max-tokens 0 is not allowed"),
    (DECODE + " --cudagraph-max-tokens -5", 2, "--cudagraph-max-tokens -5 is not allowed"),
    (STEP + " --phase decode --batch 1 --context nan", 2, "--context nan is not allowed"),
    (DECODE + " --calibration {tmp}/list.json", 2, "holds a JSON list"),
    (DECODE + " --calibration {tmp}/brace.json", 2, "is not valid JSON"),
    (DECODE + " --tp 3", 2, "use one of [1, 2, 4, 8, 16, 32] for --tp"),
    (STEP + " --phase decode --batch 0 --context 10", 2, "--batch 0 is not allowed"),
    (STEP + " --phase prefill --tokens 10 --prior-tokens -1", 2, "--prior-tokens -1 is not allowed"),
    (STEP + " --phase prefill --tokens 0", 2, "--tokens 0 is not allowed"),
    (DECODE + " --prior-tokens 500", 2, "a decode step's cached tokens are --context"),
    (DECODE + " --kv-cache-dtype fp4", 2, "--kv-cache-dtype 'fp4' is not supported"),
    (DECODE + " --gpu-memory-utilization 2", 2, "a fraction in (0, 1]"),
    (STEP + " --phase decode --batch 1 --context 200000", 2, "lower --context"),
    # -- simulate ---------------------------------------------------------------------------------
    (SIM + " --max-num-batched-tokens 1", 2, "raise --max-num-batched-tokens to at least 256"),
    (SIM + " --block-size 7", 2, "--block-size 7 is not allowed"),
    (SIM + " --block-size 2048", 2, "a multiple of 16 between 16 and 1024"),
    (SIM + " --seed -1", 2, "--seed -1 is not allowed: it is the random seed and must be >= 0"),
    (SIM + " --seed 4294967296", 2, "must be <= 4294967295"),
    (SIM + " --long-prefill-token-threshold 5000", 2, "use at most 2048 tokens"),
    (SIM + " --rate nan", 2, "--rate nan is not allowed"),
    (SIM + " --rate 0", 2, "must be > 0"),
    ("simulate --requests 0", 2, "--requests 0 is not allowed"),
    (SIM + " --num-blocks 0", 2, "--num-blocks 0 is not allowed"),
    (SIM + " --max-num-seqs 0", 2, "--max-num-seqs 0 is not allowed"),
    (SIM + " --shared-prefix-tokens -1", 2, "--shared-prefix-tokens -1 is not allowed"),
    (PERF + " --calibration {tmp}/brace.json", 2, "is not valid JSON"),
    (PERF + " --calibration {tmp}/object.json", 2, 'has no "coefficients" object'),
    ('simulate --requests 5 --config llama-3.1-8b --gpu ""', 2, "--gpu '' is empty"),
    (PERF + " --tp 3", 2, "use one of [1, 2, 4, 8, 16, 32] for --tp"),
    (PERF + " --kv-cache-dtype fp4", 2, "--kv-cache-dtype 'fp4' is not supported"),
    ("simulate --requests 5 --config {tmp}/kv5.json --gpu h200", 2, "fix num_key_value_heads"),
    (SIM + " --gpu h200", 2, "drop them or use --step-model perf"),
    (PERF + " --num-blocks 1000 --max-model-len 999999", 2, "use a value in [1, 131072]"),
    (SIM + " --steps", 2, "--steps adds the per-step trace to the JSON output; add --json"),
    # -- batch ------------------------------------------------------------------------------------
    ("batch check {tmp}/empty.jsonl", 2, "holds no requests"),
    ("batch check {tmp}/blank.jsonl", 2, "holds no requests"),
    ("batch check {tmp}", 2, "is a directory, give the JSONL file"),
    ("batch check {tmp}/missing.jsonl", 2, "does not exist; pass a JSONL file"),
    ("batch check {tmp}/two.jsonl --max-tokens 0", 2, "--max-tokens 0 is not allowed"),
    ("batch repair {tmp}/missing.jsonl", 2, "does not exist; give the results JSONL"),
    ("batch repair {tmp}", 2, "is a directory, give the results JSONL file"),
    ("batch status {tmp}/two.jsonl {tmp}", 2, "is a directory, give the results JSONL file"),
    ("batch merge {tmp}/missing.jsonl --input {tmp}/two.jsonl -o {tmp}/merged.jsonl", 2, "does not exist"),
    ("batch shard {tmp}/two.jsonl --shards 2 --out-dir {tmp}/two.jsonl", 2, "is a file; give a directory"),
    ("batch shard {tmp}/empty.jsonl --shards 2 --out-dir {tmp}/shards", 2, "holds no requests"),
    ("batch shard {tmp}/two.jsonl --shards 0 --out-dir {tmp}/shards", 2, "--shards 0 is not allowed"),
    (RUN + " --chunk-size 0", 2, "--chunk-size 0 is not allowed"),
    (RUN + " --seed -1", 2, "--seed -1 is not allowed"),
    ("batch run {tmp}/empty.jsonl -o {tmp}/out.jsonl --model never-loaded", 2, "holds no requests"),
    ("batch run {tmp}/two.jsonl -o {tmp} --model never-loaded", 2, "is a directory; give a file name"),
    ("batch ray {tmp}/two.jsonl -o {tmp}/out.jsonl --model never-loaded --replicas 0", 2,
     "--replicas 0 is not allowed"),
    # -- drills: memory-kv-per-token is 128 KiB (2 x 8 KV heads x 128 x 2 bytes x 32 layers = 131,072 B)
    ('drills check memory-kv-per-token "128 GiB"', 1, "you said 128 GiB = 134,217,728 KiB"),
    ('drills check memory-kv-per-token "131072 B"', 0, "you said 131072 B = 128 KiB"),
    ('drills check memory-kv-per-token "0.125 MiB"', 0, "you said 0.125 MiB = 128 KiB"),
    ('drills check memory-kv-per-token "128 KB"', 1, "did you mean KiB?"),
    ('drills check memory-kv-per-token "128 ms"', 2, "give it in KiB"),
    ('drills check memory-kv-per-token "128K"', 2, "write the unit out, e.g. 128 KiB"),
    ('drills check memory-kv-per-token "lots"', 2, "type a number such as 4.2"),
    ('drills check memory-kv-per-token "\u2212128 KiB"', 1, "you said -128"),   # a typographic minus
    ('drills check no-such-drill "1"', 2, "no drill 'no-such-drill'; use one of"),
    ("drills show memory-kv-per-token --seed -1", 2, "seed -1 is not allowed"),
    # -- models -----------------------------------------------------------------------------------
    ("models {tmp}/kv5.json", 2, "layer 0 has 5 KV heads, which do not divide the 32 attention heads"),
    ("models {tmp}/kv64.json", 2, "layer 0 has 64 KV heads"),
    ("models {tmp}/not-json.json", 2, "is not valid JSON"),
    ("models {tmp}/list.json", 2, "must hold a JSON object"),
    ("models {tmp}/no-config", 2, "holds no config.json"),
    ("models llama-3.1-8", 2, "is neither a file, a directory with a config.json, nor a reference id"),
]


@pytest.fixture
def bad_files(tmp_path):
    """The files the rows name: bad calibrations, bad configs, empty and valid request files."""
    (tmp_path / "brace.json").write_text("{")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "object.json").write_text("{}")
    (tmp_path / "not-json.json").write_text("not json")
    (tmp_path / "text-coefficients.json").write_text(json.dumps({"coefficients": {"H200": {"step_overhead_s": "fast"}}}))
    (tmp_path / "unknown-gpu.json").write_text(json.dumps({"coefficients": {"Z9000": {}}}))
    llama = json.loads((MODELS_DIR / "llama-3.1-8b.json").read_text())
    assert llama["num_attention_heads"] == 32 and llama["num_key_value_heads"] == 8
    (tmp_path / "kv5.json").write_text(json.dumps({**llama, "num_key_value_heads": 5}))
    (tmp_path / "kv64.json").write_text(json.dumps({**llama, "num_key_value_heads": 64}))
    (tmp_path / "no-config").mkdir()
    (tmp_path / "weights.safetensors").write_bytes(bytes([0xFA, 0x00, 0xFF]) * 64)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    (tmp_path / "two.jsonl").write_text('{"id": "a", "prompt": "hi", "max_tokens": 4}\n'
                                        '{"id": "b", "prompt": "yo", "max_tokens": 4}\n')
    return tmp_path


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``servebook ARGV`` in-process: (status, stdout, stderr); argparse's own errors exit 2 too."""
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


def test_there_are_at_least_sixty_rows_across_the_commands():
    commands = {line.split()[0] for line, _, _ in CASES}
    assert len(CASES) >= 60
    assert commands >= {"plan", "fleet", "step", "simulate", "batch", "drills", "models"}


@pytest.mark.parametrize("line, status, phrase", CASES, ids=[c[0] for c in CASES])
def test_a_mistake_gets_its_status_and_a_message_saying_what_to_change(bad_files, capsys, line, status, phrase):
    argv = shlex.split(line.replace("{tmp}", str(bad_files)))
    got, out, err = run_cli(argv, capsys)
    assert got == status, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    assert phrase in (err if status == 2 else out), err or out
    if status == 2:
        assert f"servebook {argv[0]}: error: " in err, err    # one line naming the command, no stack


# -- one mistake, one message, whichever command it is made in ---------------------------------------

COMMANDS = {"plan": "plan --config llama-3.1-8b", "fleet": FLEET, "step": DECODE, "simulate": PERF}
ACROSS = [
    ('--gpu ""', ("plan", "fleet", "step", "simulate")),
    ("--gpu-memory-utilization 1.5", ("plan", "fleet", "step", "simulate")),
    ("--gpu-memory-utilization nan", ("plan", "fleet", "step", "simulate")),
    ("--tp 0", ("plan", "fleet", "step", "simulate")),
    ("--kv-cache-dtype fp4", ("fleet", "step", "simulate")),        # plan's parser lists its two choices
    ("--calibration {tmp}/list.json", ("fleet", "step", "simulate")),
    ("--calibration {tmp}/brace.json", ("fleet", "step", "simulate")),
    ("--max-model-len 999999", ("plan", "simulate")),
    ("--cudagraph-max-tokens 0", ("fleet", "step")),
    ("--max-num-batched-tokens 0", ("plan", "fleet", "simulate")),
]


@pytest.mark.parametrize("flags, commands", ACROSS, ids=[a[0] for a in ACROSS])
def test_the_same_mistake_reads_the_same_in_every_command(bad_files, capsys, flags, commands):
    messages = {}
    for name in commands:
        argv = shlex.split(f"{COMMANDS[name]} {flags}".replace("{tmp}", str(bad_files)))
        status, _, err = run_cli(argv, capsys)
        assert status == 2 and "Traceback" not in err
        messages[name] = err.split(": error: ", 1)[1]
    assert len(set(messages.values())) == 1, messages


# -- the live pages give the CLI's message for the CLI's mistake --------------------------------------

LIVE_AND_CLI = [
    ({"calculator": "plan", "gpu": ""}, 'plan --config llama-3.1-8b --gpu ""', "gpu", "--gpu"),
    ({"calculator": "plan", "tp": "0"}, "plan --config llama-3.1-8b --tp 0", "tp", "--tp"),
    ({"calculator": "plan", "gpu_memory_utilization": "1.5"},
     "plan --config llama-3.1-8b --gpu-memory-utilization 1.5", "gpu_memory_utilization", "--gpu-memory-utilization"),
    ({"calculator": "plan", "max_model_len": "0"}, "plan --config llama-3.1-8b --max-model-len 0",
     "max_model_len", "--max-model-len"),
    ({"calculator": "kv", "tp": "-1"}, "plan --config llama-3.1-8b --tp -1", "tp", "--tp"),
    ({"calculator": "fleet", "gpu": ""}, FLEET.replace("--gpu h200", '--gpu ""'), "gpu", "--gpu"),
    ({"calculator": "fleet", "gpus": "0"}, FLEET.replace("--gpus 1", "--gpus 0"), "gpus", "--gpus"),
    ({"calculator": "fleet", "kv_cache_dtype": "fp4"}, FLEET + " --kv-cache-dtype fp4", "kv_cache_dtype",
     "--kv-cache-dtype"),
    ({"calculator": "tune", "gpu": ""}, TUNE.replace("--gpu h200", '--gpu ""') + " --tpot-ms 40", "gpu", "--gpu"),
    ({"calculator": "tune", "gpus": "0"}, TUNE.replace("--gpus 1", "--gpus 0") + " --tpot-ms 40", "gpus", "--gpus"),
    ({"calculator": "tune", "rate": "-2"}, TUNE.replace("--rate 2", "--rate -2") + " --tpot-ms 40", "rate", "--rate"),
    ({"calculator": "tune", "output_tokens": "1"}, TUNE.replace("--output-tokens 50", "--output-tokens 1")
     + " --tpot-ms 40", "output_tokens", "--output-tokens"),
    ({"calculator": "tune", "tpot_ms": "0"}, TUNE + " --tpot-ms 0", "tpot_ms", "--tpot-ms"),
    ({"calculator": "tune", "ttft_ms": "-5"}, TUNE + " --ttft-ms -5 --tpot-ms 40", "ttft_ms", "--ttft-ms"),
]


@pytest.mark.parametrize("request_, line, field, flag", LIVE_AND_CLI, ids=[c[1] for c in LIVE_AND_CLI])
def test_a_live_page_and_the_cli_say_the_same_for_the_same_mistake(capsys, request_, line, field, flag):
    reply = live.compute({"model": "llama-3.1-8b", **request_})
    status, _, err = run_cli(shlex.split(line), capsys)
    assert reply["ok"] is False and status == 2
    cli_message = err.split(": error: ", 1)[1].strip()
    assert reply["error"] == cli_message.replace(flag, field, 1)


def test_config_and_gpu_names_as_tools_write_them_are_read(tmp_path, capsys):
    """Not mistakes: a config.json an editor saved with a byte-order mark, the GPU as torch names it."""
    config = tmp_path / "config.json"
    config.write_bytes(b"\xef\xbb\xbf" + (MODELS_DIR / "llama-3.1-8b.json").read_bytes())
    assert run_cli(["models", str(config)], capsys)[0] == 0
    status, out, _ = run_cli(["plan", "--config", "llama-3.1-8b", "--gpu", "NVIDIA H200", "--json"], capsys)
    assert status == 0 and json.loads(out)["gpu"] == "H200-SXM-141GB"


def test_a_bad_calibration_named_by_the_environment_says_so(bad_files, capsys, monkeypatch):
    monkeypatch.setenv("SERVEBOOK_PERF_CALIBRATION", str(bad_files / "list.json"))
    status, _, err = run_cli(shlex.split(DECODE), capsys)
    assert status == 2 and "point $SERVEBOOK_PERF_CALIBRATION at a calibration record" in err


def test_live_refuses_an_empty_gpu_instead_of_planning_for_the_default():
    reply = live.compute({"calculator": "plan", "model": "llama-3.1-8b", "gpu": "  "})
    assert reply["ok"] is False and "is empty: give a GPU name" in reply["error"]


# -- real processes --------------------------------------------------------------------------------

def _env() -> dict:
    """This checkout's servebook first on the path, whatever is installed."""
    src = str(Path(servebook.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}


def test_a_reader_that_closes_the_pipe_early_gets_no_traceback():
    """``servebook plan ... | head -1``: the reader is gone before the table is written."""
    proc = subprocess.Popen([sys.executable, "-m", "servebook", "plan", "--config", "llama-3.1-8b"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    proc.stdout.close()                       # as `head -1` does once it has its line (here: before any)
    err = proc.stderr.read().decode()
    status = proc.wait(timeout=120)
    assert status in (0, 141), err            # 141 = 128 + SIGPIPE, what a shell reports for `yes | head`
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_a_negative_seed_in_a_real_process_is_one_line_and_status_2():
    proc = subprocess.run([sys.executable, "-m", "servebook", "simulate", "--requests", "5", "--seed", "-1"],
                          capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["servebook simulate: error: --seed -1 is not allowed: it is the random seed "
                                        "and must be >= 0"]
