"""servebook.live, the facade the book's "Run live" calculators call in the browser (Pyodide).

Its numbers must be the public functions' numbers for the same inputs, its errors the library's
own messages, and it must import and run without numpy (Pyodide ships none).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from servebook import DoesNotFitError, live, make_plan
from servebook.errors import ConfigError
from servebook.kv_cache import kv_cache_layout, min_kv_bytes_for_one_request
from servebook.hf_config import load_model_spec
from servebook.shipped import MODELS_DIR

SRC = Path(__file__).resolve().parents[1] / "src"


def _numbers(reply: dict) -> dict:
    assert reply["ok"], reply.get("error")
    return {n["key"]: n["value"] for n in reply["numbers"]}


@pytest.mark.parametrize("inputs", [
    {"model": "gemma-4-26b-a4b", "gpu": "H200", "tp": 1, "max_model_len": 16384,
     "gpu_memory_utilization": 0.92, "kv_cache_dtype": "auto"},
    {"model": "llama-3.1-70b", "gpu": "H100", "tp": 4, "max_model_len": 32768,
     "gpu_memory_utilization": 0.85, "kv_cache_dtype": "fp8"},
    {"model": "qwen3-30b-a3b", "gpu": "A100-SXM-80GB", "tp": 2, "max_model_len": 4096,
     "gpu_memory_utilization": 0.9, "kv_cache_dtype": "auto"},
])
def test_plan_numbers_are_make_plans(inputs):
    plan = make_plan(inputs["model"], gpu=inputs["gpu"], tp=inputs["tp"], max_model_len=inputs["max_model_len"],
                     gpu_memory_utilization=inputs["gpu_memory_utilization"],
                     kv_cache_dtype=inputs["kv_cache_dtype"])
    # as an HTML form sends them: every value a string
    got = _numbers(live.compute({"calculator": "plan", **{k: str(v) for k, v in inputs.items()}}))
    assert got["kv_cache_tokens"] == plan.capacity.kv_cache_tokens
    assert got["max_concurrency"] == plan.capacity.max_concurrency
    assert got["recommended_max_num_seqs"] == plan.recommended_max_num_seqs
    assert got["available_kv_gib"] == plan.budget.available_kv_gib
    assert got["weights_gib"] == plan.budget.weights_gib
    assert got["kv_bytes_per_token"] == plan.capacity.layout.kv_bytes_per_token


def test_a_model_that_does_not_fit_shows_the_librarys_message():
    with pytest.raises(DoesNotFitError) as exc:
        make_plan("llama-3.1-70b", gpu="H100", tp=1, max_model_len=8192)
    reply = live.compute({"calculator": "plan", "model": "llama-3.1-70b", "gpu": "H100", "tp": "1",
                          "max_model_len": "8192"})
    assert reply == {"ok": False, "error": str(exc.value)}
    assert "use --tp 2" in reply["error"]


def test_a_pasted_config_is_read_like_a_file(tmp_path):
    text = (MODELS_DIR / "llama-3.1-8b.json").read_text()
    path = tmp_path / "config.json"
    path.write_text(text)
    plan = make_plan(str(path), gpu="H200", max_model_len=8192)
    reply = live.compute({"calculator": "plan", "config_json": text, "gpu": "H200", "max_model_len": 8192})
    assert _numbers(reply)["kv_cache_tokens"] == plan.capacity.kv_cache_tokens
    # the command names a placeholder folder, as make_plan does for a JSON file outside a model folder
    assert reply["command"] == plan.serve_command().replace(str(tmp_path), "MODEL_DIR")
    assert reply["command"].startswith("vllm serve MODEL_DIR ")


@pytest.mark.parametrize("text", ["{bad json", '{"architectures": ["LlamaForCausalLM"]}', "[1, 2]"])
def test_a_malformed_pasted_config_gets_the_librarys_message(tmp_path, text):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        make_plan(str(path))
    reply = live.compute({"calculator": "plan", "config_json": text})
    assert reply == {"ok": False, "error": str(exc.value).replace(str(path), live.PASTED)}
    assert "the pasted config.json" in reply["error"]


def test_an_empty_paste_box_says_what_to_paste():
    reply = live.compute({"calculator": "plan", "config_json": "  ", "model": "llama-3.1-8b"})
    assert not reply["ok"] and reply["error"].startswith("the config.json box is empty; paste")


def test_form_values_that_are_not_numbers_name_the_field():
    for key, value in (("tp", "two"), ("max_model_len", "8k"), ("max_model_len", "1.5"),
                       ("gpu_memory_utilization", "")):
        reply = live.compute({"calculator": "plan", key: value})
        assert not reply["ok"] and reply["error"].startswith(f"{key} {value!r} is not"), reply
    assert live.compute({"calculator": "plan", "gpu_memory_utilization": "1.5"})["error"] \
        .startswith("gpu_memory_utilization")  # the library's own range check


def test_kv_numbers_are_the_layouts():
    spec = load_model_spec("llama-3.1-8b")
    layout = kv_cache_layout(spec, kv_cache_dtype="fp8")
    got = _numbers(live.compute({"calculator": "kv", "model": "llama-3.1-8b", "context_tokens": "1000",
                                 "kv_cache_dtype": "fp8"}))
    assert got == {"kv_bytes_per_token": layout.kv_bytes_per_token,
                   "kv_bytes_per_sequence": min_kv_bytes_for_one_request(layout, 1000, in_flight_tokens=0)}


def test_the_memory_bar_is_svg_whose_parts_fill_the_gpu():
    reply = live.compute({"calculator": "plan"})
    svg = ET.fromstring(reply["svg"])
    width = float(svg.get("width"))
    bar = [r for r in svg.iter("{http://www.w3.org/2000/svg}rect") if r.get("height") == "28"]
    assert len(bar) == 6
    assert sum(float(r.get("width")) for r in bar) == pytest.approx(width, abs=0.5)


def test_json_in_and_out():
    out = json.loads(live.compute_json(json.dumps({"calculator": "kv", "model": "llama-3.1-8b"})))
    assert out["ok"] and out["model"]
    assert "not valid JSON" in json.loads(live.compute_json("{"))["error"]
    assert live.compute({"calculator": "fleet?"})["error"].startswith("unknown calculator 'fleet?'")


def test_options_offer_the_shipped_models_and_the_catalogues_gpus():
    opts = live.options()
    assert "llama-3.1-8b" in opts["models"] and "H200-SXM-141GB" in opts["gpus"]
    assert opts["defaults"]["model"] in opts["models"] and opts["defaults"]["gpu"] in opts["gpus"]


def test_the_facade_runs_without_numpy():
    """What Pyodide sees: numpy cannot be imported. The plan and KV calculators still run."""
    out = _without_numpy(
        "import json, servebook.live as live\n"
        "opts = live.options()\n"
        "print(json.dumps({c: live.compute({'calculator': c, 'context_tokens': 8000})['ok'] for c in opts['calculators']}))\n"
        "print(json.dumps(opts['unavailable']))\n"
        "print('numpy' in sys.modules and sys.modules['numpy'] is not None)\n"
    )
    oks, unavailable, numpy_loaded = out.splitlines()
    oks, unavailable = json.loads(oks), json.loads(unavailable)
    assert {"plan", "kv"} <= set(oks) and all(oks.values()), oks
    # an optional calculator is either offered (and runs) or named with the reason, never both or neither
    assert set(oks) | set(unavailable) == set(live.options()["calculators"]) and not set(oks) & set(unavailable)
    assert numpy_loaded == "False"


def _without_numpy(code: str) -> str:
    """stdout of ``code`` in a fresh CPython where ``import numpy`` fails, as under Pyodide."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", "import sys; sys.modules['numpy'] = None\n" + code],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_chunk_calculator_is_recommend_max_num_batched_tokens():
    from servebook.perf.chunk_budget import mixed_step_s, recommend_max_num_batched_tokens
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients

    spec, gpu = load_model_spec("qwen3-32b"), gpu_numbers("H100")
    coeffs, _ = calibrated_coefficients(gpu.name)
    r = recommend_max_num_batched_tokens(spec, gpu, coeffs, target_step_s=0.080, max_num_seqs=16,
                                         decode_context_tokens=4000, tp=2)
    got = _numbers(live.compute({"calculator": "chunk", "model": "qwen3-32b", "gpu": "H100", "tp": "2",
                                 "max_num_seqs": "16", "context_tokens": "4000", "target_step_ms": "80"}))
    assert got["recommended"] == r["recommended"] and got["chunk_tokens"] == r["chunk_tokens"]
    assert got["recommended_step_ms"] == pytest.approx(r["recommended_step_s"] * 1e3, rel=1e-12)
    assert got["decode_only_ms"] == pytest.approx(mixed_step_s(spec, gpu, coeffs, prefill_tokens=0, decode_batch=16,
                                                               decode_context_tokens=4000, tp=2) * 1e3, rel=1e-12)
    # a decode batch that alone overruns the target: the library's message
    reply = live.compute({"calculator": "chunk", "model": "qwen3-32b", "gpu": "H100", "max_num_seqs": "512",
                          "context_tokens": "32000", "target_step_ms": "10"})
    assert not reply["ok"] and "raise the target, lower --max-num-seqs or add GPUs" in reply["error"]


def test_the_speculation_calculator_is_speculative_step():
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients
    from servebook.perf.speculative import break_even_acceptance, speculative_step

    spec, gpu = load_model_spec("gemma-4-31b"), gpu_numbers("H200")
    coeffs, _ = calibrated_coefficients(gpu.name)
    step = speculative_step(spec, gpu, coeffs, k=3, alpha=0.6, batch=64, context_tokens=2048)
    even = break_even_acceptance(spec, gpu, coeffs, k=3, batch=64, context_tokens=2048)
    got = _numbers(live.compute({"calculator": "speculation", "model": "gemma-4-31b", "gpu": "H200", "k": "3",
                                 "acceptance": "0.6", "batch": "64", "context_tokens": "2048"}))
    assert got["tokens_per_step"] == pytest.approx(1 + 0.6 + 0.36 + 0.216, rel=1e-12)   # E(3, 0.6) by hand
    assert got["speedup"] == pytest.approx(step.speedup, rel=1e-12)
    assert got["verify_step_ms"] == pytest.approx(step.verify_s * 1e3, rel=1e-12)
    assert got["break_even_acceptance"] == pytest.approx(even, rel=1e-12)
    bad = live.compute({"calculator": "speculation", "acceptance": "1.5"})
    assert not bad["ok"] and "acceptance between 0 and 1" in bad["error"]


def test_the_page_script_has_controls_for_every_calculator_and_only_known_fields():
    """servebook-live.js's FIELDS (the controls it draws) name each calculator and only inputs the facade reads."""
    script = (SRC.parent / "book" / "_ext" / "live" / "servebook-live.js").read_text()
    block = re.search(r"const FIELDS = \{(.*?)\n  \};", script, re.S).group(1)
    fields = {name: re.findall(r'"(\w+)"', body) for name, body in re.findall(r"(\w+): \[([^\]]*)\]", block)}
    opts = live.options()
    assert set(fields) == set(opts["calculators"]) | set(opts["unavailable"])
    known = set(live.DEFAULTS)
    for name, names in fields.items():
        assert names and set(names) <= known, (name, set(names) - known)


def test_the_fleet_calculator_is_the_fleet_plan():
    from servebook.perf.fleet import Deployment, LengthDistribution, Workload, plan
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients

    spec, gpu = load_model_spec("gemma-4-26b-a4b"), gpu_numbers("H100")
    job = Workload(200_000, LengthDistribution.fixed(3000), LengthDistribution.fixed(700))
    p = plan(job, Deployment.of(spec, gpu=gpu, gpus=16, name="x", tp=2, max_num_batched_tokens=16384, kv_cache_dtype="fp8"),
             calibrated_coefficients(gpu.name)[0])
    got = _numbers(live.compute({"calculator": "fleet", "model": "gemma-4-26b-a4b", "gpu": "H100", "gpus": "16",
                                 "tp": "2", "requests": "200000", "input_tokens": "3000", "output_tokens": "700",
                                 "max_num_batched_tokens": "16384", "kv_cache_dtype": "fp8"}))
    assert got["replicas"] == 16 // 2 == p.replicas and got["batch"] == p.batch
    assert got["hours"] == pytest.approx(p.hours, rel=1e-12)
    assert got["gpu_hours"] == pytest.approx(p.hours * 16, rel=1e-12)     # every GPU busy the whole job
    assert got["requests_per_s"] == pytest.approx(200_000 / (p.hours * 3600), rel=1e-9)
    for key, value in (("gpus", "0"), ("requests", "-5"), ("input_tokens", "0")):
        reply = live.compute({"calculator": "fleet", key: value})
        # servebook.validation's wording, the same as `servebook fleet --gpus 0` (with the flag's name)
        assert reply["ok"] is False and reply["error"].startswith(f"{key} {int(value)} is not allowed: it is the ")
        assert reply["error"].endswith("and must be >= 1")
    # Graphs captured up to the step budget (6.22's setting): the same plan as the library's, and
    # faster than vLLM's default capture size, whose 16,384-token steps run eagerly.
    graphs = plan(job, Deployment.of(spec, gpu=gpu, gpus=16, name="x", tp=2, max_num_batched_tokens=16384, kv_cache_dtype="fp8",
                                  cudagraph_max_tokens=16384), calibrated_coefficients(gpu.name)[0])
    got = _numbers(live.compute({"calculator": "fleet", "model": "gemma-4-26b-a4b", "gpu": "H100", "gpus": "16",
                                 "tp": "2", "requests": "200000", "input_tokens": "3000", "output_tokens": "700",
                                 "max_num_batched_tokens": "16384", "kv_cache_dtype": "fp8",
                                 "cudagraph_max_tokens": "16384"}))
    assert got["hours"] == pytest.approx(graphs.hours, rel=1e-12) and graphs.hours < p.hours
    reply = live.compute({"calculator": "fleet", "cudagraph_max_tokens": "-1"})
    assert reply["ok"] is False and reply["error"].startswith("cudagraph_max_tokens -1 is out of range; use 0")


# -- tune: the latency search, on the live grid -------------------------------------------------------

TUNE_CASES = [
    # the defaults miss TPOT on one GPU: TP 2 (6.11's starting values)
    {"model": "qwen3-32b", "gpu": "H200", "gpus": 4, "rate": 4, "input_tokens": 1024, "output_tokens": 256,
     "ttft_ms": 1000, "tpot_ms": 35},
    # a GPU without held-out runs (no band)
    {"model": "llama-3.1-8b", "gpu": "H100", "gpus": 2, "rate": 10, "input_tokens": 512, "output_tokens": 128,
     "ttft_ms": 500, "tpot_ms": 30},
    # nothing within 4 GPUs meets the targets: the binding target, no serve line
    {"model": "llama-3.1-70b", "gpu": "H200", "gpus": 4, "rate": 8, "input_tokens": 1024, "output_tokens": 256,
     "ttft_ms": 1000, "tpot_ms": 35},
]


@pytest.mark.parametrize("inputs", TUNE_CASES, ids=[c["model"] for c in TUNE_CASES])
def test_the_tune_calculator_picks_what_servebook_tune_picks(capsys, inputs):
    from servebook.cli import main

    argv = ["tune", "--config", inputs["model"], "--gpu", inputs["gpu"], "--gpus", str(inputs["gpus"]),
            "--rate", str(inputs["rate"]), "--input-tokens", str(inputs["input_tokens"]),
            "--output-tokens", str(inputs["output_tokens"]), "--ttft-ms", str(inputs["ttft_ms"]),
            "--tpot-ms", str(inputs["tpot_ms"]), "--percentile", "90", "--tp", "1,2", "--kv-cache-dtypes", "auto"]
    rc = main(argv + ["--json"])
    cli = json.loads(capsys.readouterr().out)
    reply = live.compute({"calculator": "tune", **{k: str(v) for k, v in inputs.items()}})
    assert reply["ok"], reply.get("error")
    assert (live.LIVE_TUNE_TPS, live.LIVE_TUNE_KV_CACHE_DTYPES) == ((1, 2), ("auto",))   # the grid argv names
    # the page tells the reader the command line that runs the same search
    assert shlex.split(reply["note"].split("on the command line: ", 1)[1]) == ["servebook"] + argv
    best = cli["best"]
    if best is None:
        assert rc == 1 and reply["pick"] is None and "command" not in reply
        assert reply["binding"] == cli["binding"] and "binds" in reply["binding"]
    else:
        assert rc == 0 and reply["command"] == best["serve_command"]
        pick = reply["pick"]
        assert (pick["gpus"], pick["tp"], pick["replicas"]) == (best["gpus"], best["tp"], best["replicas"])
        assert pick["tpot_ms"] == pytest.approx(best["prediction"]["tpot_p90_s"] * 1e3, rel=1e-12)
        assert pick["ttft_ms"] == pytest.approx(best["prediction"]["ttft_p90_s"] * 1e3, rel=1e-12)
        # meeting a target means beating it by the allowance (25% at p90)
        assert pick["tpot_ms"] * 1.25 <= inputs["tpot_ms"] and pick["ttft_ms"] * 1.25 <= inputs["ttft_ms"]
    assert [(p["tp"], p["replicas"], p["flags"] == "defaults") for p in reply["frontier"]] == \
        [(c["tp"], c["replicas"], not c["changed_flags"] and c["kv_cache_dtype"] == "auto") for c in cli["frontier"]]
    assert [p["tpot_ms"] for p in reply["frontier"]] == \
        pytest.approx([c["prediction"]["tpot_p90_s"] * 1e3 for c in cli["frontier"]], rel=1e-12)
    # frontier: by throughput per GPU descending, each faster one has the longer TPOT (else it dominates)
    tput = [p["tokens_per_s_per_gpu"] for p in reply["frontier"]]
    assert tput == sorted(tput, reverse=True)
    assert all(a["tpot_ms"] > b["tpot_ms"] for a, b in zip(reply["frontier"], reply["frontier"][1:]))


def test_the_tune_chart_marks_the_frontier_the_pick_the_band_and_the_target():
    reply = live.compute({"calculator": "tune", **{k: str(v) for k, v in TUNE_CASES[0].items()}})
    svg = ET.fromstring(reply["svg"])
    ns = "{http://www.w3.org/2000/svg}"
    circles = {c.get("class"): [] for c in svg.iter(ns + "circle")}
    for c in svg.iter(ns + "circle"):
        circles[c.get("class")].append(c)
    assert len(circles["frontier-point"]) == len(reply["frontier"]) >= 2
    (pick,) = circles["pick"]
    lines = {ln.get("class"): ln for ln in svg.iter(ns + "line") if ln.get("class")}
    x_of = {name: float(lines[name].get("x1")) for name in ("target", "allowance")}
    # x is p90 TPOT: the pick lies left of the target less its allowance, which lies left of the target
    assert float(pick.get("cx")) < x_of["allowance"] < x_of["target"]
    # the band (measured = predicted / (1 + error), 80% of held-out runs) spans the pick: its error band
    # runs from about -5% to +19% on an H200 (perf/data/serving_path.json), so it straddles the prediction
    band = lines["band"]
    assert float(band.get("x1")) < float(pick.get("cx")) < float(band.get("x2"))
    assert float(band.get("y1")) == float(pick.get("cy"))
    # a higher point is more output tokens/s per GPU: SVG's y grows downwards
    by_tput = sorted(circles["frontier-point"], key=lambda c: float(c.get("cy")))
    assert [float(c.get("cx")) for c in by_tput] == sorted((float(c.get("cx")) for c in by_tput), reverse=True)


def test_the_tune_calculator_refuses_more_gpus_than_its_grid():
    reply = live.compute({"calculator": "tune", "model": "qwen3-32b", "gpus": "8"})
    assert reply == {"ok": False, "error": "gpus 8 is not allowed: it is the most GPUs the live search may use and "
                                           "must be <= 4 (servebook tune searches any number)"}


def test_a_pasted_config_gets_placeholders_in_the_tune_lines(tmp_path, capsys):
    """The servebook tune line names the reader's config.json and the serve lines a model folder, never
    the temporary files the page wrote; run from a folder holding that config.json, the line picks the same."""
    from servebook.cli import main

    text = (MODELS_DIR / "llama-3.1-8b.json").read_text()
    reply = live.compute({"calculator": "tune", "config_json": text, "gpu": "H200", "gpus": "2", "rate": "6",
                          "input_tokens": "512", "output_tokens": "128", "ttft_ms": "800", "tpot_ms": "40"})
    assert reply["ok"], reply.get("error")
    temporary = re.escape(tempfile.gettempdir()) + r"|servebook-live-(?!frontier\b|bar\b)"
    assert not re.search(temporary, json.dumps(reply)), json.dumps(reply)[:300]
    assert reply["model"] == live.PASTED
    line = shlex.split(reply["note"].split("on the command line: ", 1)[1])
    assert line[line.index("--config") + 1] == "config.json"
    assert reply["command"].startswith("vllm serve MODEL_DIR ") and reply["pick"]["serve_command"] == reply["command"]
    (tmp_path / "config.json").write_text(text)
    line[line.index("--config") + 1] = str(tmp_path / "config.json")
    assert main(line[1:] + ["--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert best["serve_command"].replace(str(tmp_path), "MODEL_DIR") == reply["command"]
