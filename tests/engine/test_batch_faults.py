"""kill -9 the batch driver at seeded random points, resume each time: nothing lost, nothing twice.

The driver (``python -m servebook batch run``) runs in the vLLM environment on a tiny
dummy-weight Llama (greedy, ``ignore_eos``). One uninterrupted run is the reference. A
second run on the same input is killed with SIGKILL (its whole process group, as a node
failure would) after the output file has grown by a seeded random number of records,
then resumed; after the last kill the test also appends half a record, as a write cut
short by a crash leaves it. The final resume must repair that tail, skip every done
request, and leave exactly one record per request, each equal to the reference run's.
Three bad lines (missing id, duplicate id, prompt longer than max_model_len) sit in the input;
with ``--skip-invalid`` each run lists them, with line numbers, in ``<output>.rejected.jsonl``.

Cost: one engine start per run (reference + killed runs + final), ~20-40 s each here.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from servebook.batch.store import read_results
from servebook.batch.workload import WorkloadSpec, make_requests
from servebook.engine_env import cpu_engine_env, engine_lock, vllm_python

pytestmark = pytest.mark.engine

SEED = 20261130
KILLS = 3
SPEC = WorkloadSpec(num_requests=48, num_prefixes=4, prefix_tokens=32, tail_tokens=(4, 60),
                    output_tokens=(16, 40), vocab_size=512, seed=7)
CHUNK = 8
DRIVER_FLAGS = ["--load-format", "dummy", "--max-model-len", "256", "--max-num-seqs", "16", "--enforce-eager",
                "--seed", "0", "--dtype", "float32", "--chunk-size", str(CHUNK), "--min-shared-tokens", "32",
                "--skip-invalid"]
#: Text prompts (tokenized by the engine's tokenizer): the tiny word-level tokenizer gives one token
#: per word plus <s>, so these are 3 and 8 prompt tokens (tests/engine/test_vllm_cpu_smoke.py).
TEXT_ROWS = [{"id": "text-0", "prompt": "hello world", "max_tokens": 8},
             {"id": "text-1", "prompt": "tell me a story about a cat", "max_tokens": 12}]
TEXT_PROMPT_TOKENS = {"text-0": 3, "text-1": 8}
#: Bad lines mixed into the input (1-based line number after insertion -> what is wrong).
BAD_LINES = {5: '{"prompt_token_ids": [11, 12], "max_tokens": 4}',                       # missing id
             20: None,                                                                   # duplicate id (filled in)
             33: None}                                                                   # prompt > max_model_len


def complete_records(path: Path) -> int:
    """Newline-terminated lines in the output (what the driver has made durable)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def driver_cmd(model_dir: Path, src: Path, out: Path) -> list[str]:
    return [str(vllm_python()), "-m", "servebook", "batch", "run", str(src), "-o", str(out),
            "--model", str(model_dir), *DRIVER_FLAGS]


def engine_env() -> dict:
    env = cpu_engine_env(1)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # engine in the driver's process: one start, one kill
    return env


def run_to_end(cmd, log: Path) -> dict:
    with open(log, "w") as handle:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=handle, text=True, timeout=240, env=engine_env())
    assert proc.returncode == 0, log.read_text()[-3000:]
    lines = [l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_BATCH ")]
    assert len(lines) == 1, proc.stdout[-3000:]
    return json.loads(lines[0].split(" ", 1)[1])


def run_and_kill(cmd, out: Path, grow_by: int, delay_s: float, log: Path) -> tuple[int, int]:
    """Start the driver, SIGKILL its process group once ``out`` holds ``grow_by`` more records
    (then ``delay_s`` later). Returns (records before, records after the kill)."""
    before = complete_records(out)
    with open(log, "w") as handle:
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=engine_env(),
                                start_new_session=True)
        deadline = time.monotonic() + 240
        while complete_records(out) < before + grow_by:
            assert proc.poll() is None, f"driver exited before the kill point:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "driver made no progress in 240 s"
            time.sleep(0.01)
        time.sleep(delay_s)
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL, "the driver finished before it could be killed"
    return before, complete_records(out)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch-faults")
    model_dir = root / "model"
    # Written by the vLLM environment's Python so the tiny tokenizer (``tokenizers``) is included.
    subprocess.run([str(vllm_python()), "-c", "import sys; from servebook.tiny_model import write_model_dir; "
                    "write_model_dir(sys.argv[1])", str(model_dir)], check=True, timeout=120)
    rows = make_requests(SPEC, sampling={"temperature": 0.0, "ignore_eos": True})
    rows += [{**r, "sampling": {"temperature": 0.0, "ignore_eos": True}} for r in TEXT_ROWS]
    lines = [json.dumps(r) for r in rows]
    bad = dict(BAD_LINES)
    bad[20] = json.dumps({**rows[2], "max_tokens": 3})                                    # repeats rows[2]'s id
    bad[33] = json.dumps({"id": "too-long", "prompt_token_ids": [11] * 256, "max_tokens": 1})  # 256 >= 256
    for number in sorted(bad):
        lines.insert(number - 1, bad[number])
    src = root / "requests.jsonl"
    src.write_text("\n".join(lines) + "\n")
    return root, model_dir, src, rows


def test_kill9_at_random_points_then_resume_equals_uninterrupted_run(job):
    root, model_dir, src, rows = job
    n = len(rows)                                               # 48 token-id + 2 text requests
    rng = random.Random(SEED)
    started = time.monotonic()
    history = []
    with engine_lock():
        reference = root / "reference.jsonl"
        ref_summary = run_to_end(driver_cmd(model_dir, src, reference), root / "reference.log")
        assert (ref_summary["ran"], ref_summary["already_done"]) == (n, 0)

        out = root / "killed.jsonl"
        torn_bytes = 0
        for attempt in range(KILLS):
            grow_by = rng.randint(1, 12)
            delay_s = rng.uniform(0.0, 0.3)
            before, after = run_and_kill(driver_cmd(model_dir, src, out), out, grow_by, delay_s,
                                         root / f"killed-{attempt}.log")
            history.append({"grow_by": grow_by, "delay_s": round(delay_s, 3), "before": before, "after": after})
            # The kill came after the file grew by grow_by records. (Chunks are appended with one
            # write, so `after` is normally a multiple of CHUNK; a kill inside that write could cut
            # it, which the final repair would handle.)
            assert before + grow_by <= after <= n, history
            if after == n:
                # On an idle machine the last chunks can finish inside delay_s: the job outran this
                # kill and there is nothing left to crash. Later attempts would find it complete.
                break
        # At least one kill interrupted the job (the first always does: 50 requests, <= 12 grown).
        assert any(h["after"] < n for h in history), history
        whole = out.read_bytes().splitlines(keepends=True)[-1]
        torn = whole[: len(whole) // 2]
        with open(out, "ab") as handle:              # a later record's write cut short by the crash
            handle.write(torn)
        torn_bytes = len(torn)
        records_before_final = complete_records(out)
        final = run_to_end(driver_cmd(model_dir, src, out), root / "final.log")
    elapsed = time.monotonic() - started
    print(f"kills: {history}; final resume: {final}; total {elapsed:.0f} s")

    # The three bad lines were reported by every run, with their line numbers, never run.
    rejected = [json.loads(l) for l in (root / "killed.jsonl.rejected.jsonl").read_text().splitlines()]
    assert [(r["line"], r["id"]) for r in rejected] == [(5, None), (20, rows[2]["id"]), (33, "too-long")]
    assert "max_model_len is 256" in rejected[2]["problem"] and "line 3" in rejected[1]["problem"]
    assert final["rejected"] == ref_summary["rejected"] == 3
    assert final["repaired_bytes"] == torn_bytes > 0
    assert final["already_done"] == records_before_final
    assert final["ran"] == n - records_before_final
    assert (root / "killed.jsonl.torn").read_bytes().endswith(torn)

    lines = out.read_bytes().splitlines()
    ids = [json.loads(l)["id"] for l in lines]
    assert len(ids) == len(set(ids)) == n                       # every request exactly once
    assert set(ids) == {r["id"] for r in rows}
    got, want = read_results(out), read_results(reference)
    for rid, rec in want.items():
        # Greedy with ignore_eos: each output has exactly max_tokens tokens and equals the reference.
        max_tokens = next(r["max_tokens"] for r in rows if r["id"] == rid)
        assert len(rec["token_ids"]) == max_tokens
        assert got[rid]["token_ids"] == rec["token_ids"], rid
        row = next(r for r in rows if r["id"] == rid)
        expected_prompt = TEXT_PROMPT_TOKENS[rid] if "prompt" in row else len(row["prompt_token_ids"])
        assert got[rid]["prompt_tokens"] == rec["prompt_tokens"] == expected_prompt, rid
