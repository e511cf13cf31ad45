"""Held-out error bands (servebook.perf.error_bands, servebook.lab.e2e.bands, scripts/fit_error_bands.py) and
the bands fleet, step and simulate print."""
from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

import pytest

from servebook.cli import main
from servebook.hf_config import load_model_spec
from servebook.perf.error_bands import ERROR_BANDS_FILE, Query, assess, band_of, load_bands, model_kind

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "labs" / "results"


def test_band_is_p10_p90_from_five_errors_up_and_min_max_below():
    # six errors: numpy's linear rule puts p10 at rank 0.5 and p90 at rank 4.5 (by hand)
    six = [0.3, -0.1, 0.1, 0.0, 0.2, 0.05]   # sorted: -0.1, 0, 0.05, 0.1, 0.2, 0.3
    b = band_of(six)
    assert b["method"] == "p10/p90" and b["count"] == 6
    assert b["lo"] == pytest.approx(-0.05) and b["hi"] == pytest.approx(0.25)
    three = band_of([0.1, -0.2, 0.05])
    assert three == {"lo": -0.2, "hi": 0.1, "count": 3, "method": "min/max"}
    assert band_of([]) is None


@pytest.mark.parametrize("model, kind", [("llama-3.1-8b", "dense"), ("qwen3-32b", "dense"),
                                         ("gemma-3-27b", "sliding"), ("mistral-7b-v0.1", "sliding"),
                                         ("qwen3-30b-a3b", "moe"), ("mixtral-8x7b", "moe"),
                                         ("deepseek-v2-lite", "mla_moe")])
def test_model_kinds(model, kind):
    assert model_kind(load_model_spec(model)) == kind


def _q(model="llama-3.1-8b", **kw):
    fields = dict(prediction="step", spec=load_model_spec(model), gpu_name="H200-SXM-141GB", tp=1,
                  context_tokens=1000, step="decode", graph=True)
    fields.update(kw)
    return Query(**fields)


def test_a_query_on_an_h100_is_outside_what_was_measured():
    a = assess(_q(gpu_name="H100-SXM-80GB"))
    assert not a["covers_query"] and any("H100-SXM-80GB" in w and "H200" in w for w in a["outside"])
    assert a["band"] is not None            # the H200's band is still shown, marked as not covering it
    assert assess(_q())["covers_query"]     # the same step on the H200 is inside


def test_tp2_is_outside_for_jobs_but_not_for_dense_steps_recorded_at_tp2():
    # labs/results/step_timing holds TP 2 sweeps of dense models; no end-to-end job ran with TP > 1
    tp2_sweeps = [p for p in (RESULTS / "step_timing").glob("*.json")
                  if '"tensor_parallel_size": 2' in p.read_text()]
    assert tp2_sweeps
    assert not any("TP 2" in w for w in assess(_q(tp=2))["outside"])
    job = assess(_q(prediction="job", tp=2, step=None, graph=None))
    assert any("TP 2" in w for w in job["outside"])
    assert any("TP 2" in w for w in assess(_q("qwen3-30b-a3b", tp=2))["outside"])


def test_longer_context_quantized_weights_and_speculation_are_outside():
    longest = max(json.loads(p.read_text())["engine_args"]["max_model_len"]
                  for p in (RESULTS / "e2e_issue39").glob("e2e_llama*.json"))
    assert any("context" in w for w in assess(_q(context_tokens=2 * longest))["outside"])
    assert any("quantized" in w for w in assess(_q("llama-3.1-8b-awq-int4"))["outside"])
    assert any("speculative" in w for w in assess(_q(prediction="job", step=None, speculative=True))["outside"])
    assert any("at once" in w for w in assess(_q(prediction="simulated", step=None, open_arrivals=True))["outside"])


def test_a_regime_without_held_out_points_has_no_band():
    # no held-out sliding-window job ran decode steps eagerly (above the CUDA-graph size)
    assert "step/sliding/decode/eager/tp1" not in load_bands()["bands"]
    a = assess(_q("gemma-3-27b", graph=False))
    assert a["band"] is None and not a["covers_query"]


def test_a_dense_job_band_comes_from_the_third_declaration_alone():
    # every dense model recorded end to end before it shaped the step model (perf/data/e2e_split.json);
    # e2e_issue39c/heldout.toml declared two that shaped nothing, before they ran
    import tomllib

    split = json.loads((ROOT / "src/servebook/perf/data/e2e_split.json").read_text())
    assert {"llama-3.1-8b", "qwen3-32b"} <= set(split["fitted_on"])
    declaration = tomllib.loads((RESULTS / "e2e_issue39c" / "heldout.toml").read_text())
    declared = {f"{d['record'][4:]} {d['job']}" for d in declaration["job"] if d["group"] == "held out"}
    band = load_bands()["bands"]["job/dense/tp1"]
    assert set(band["members"]) == declared and band["count"] == len(declared)
    a = assess(_q(prediction="job", step=None))
    assert a["band"] is not None and a["covers_query"]


def test_no_fitted_model_and_no_term_shaping_model_is_in_a_band():
    doc = load_bands()
    members = [m for b in doc["bands"].values() for m in b["members"]]
    jobs = [m for k, b in doc["bands"].items() if not k.startswith("step/") for m in b["members"]]
    for fitted in ("llama-3.1-8b", "qwen3-32b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b"):
        assert not any(m.split()[0].startswith(fitted) for m in jobs), fitted
    # every job declared held out before it ran (every end-to-end folder's heldout.toml) is in a job band:
    # the declarations' jobs all route as the step model prices them (uniform, or no experts)
    import tomllib
    declarations = sorted(RESULTS.glob("e2e*/heldout.toml"))
    assert len(declarations) >= 4
    for path in declarations:
        folder = path.parent.name
        declaration = tomllib.loads(path.read_text())
        regrouped = {(r["record"], r["job"]) for r in declaration.get("regrouped", [])}
        for d in declaration["job"]:
            inside = any(m.startswith(f"{d['record'][4:]} {d['job']}") for m in jobs)
            if (d["record"], d["job"]) in regrouped:  # its model shaped a term after the run: fitted, in no band
                assert not inside, d["record"]
            elif d["group"] == "held out":
                assert inside, (folder, d["record"], d["job"])
    # step-sweep points come only from the calibration's held-out half (its split rule)
    assert members


def test_repeats_are_averaged_not_counted_twice():
    # two gemma-3-27b records ran job long-output-192 with the same seed: one member, "x2 averaged"
    runs = [(p.name, j["seed"]) for p in (RESULTS / "e2e").glob("e2e_gemma-3-27b*.json")
            for j in json.loads(p.read_text())["jobs"] if j["name"] == "long-output-192"]
    assert len(runs) == 2 and runs[0][1] == runs[1][1]
    members = load_bands()["bands"]["job/sliding/tp1"]["members"]
    gemma = [m for m in members if m.startswith("gemma-3-27b long-output-192")]
    assert gemma == ["gemma-3-27b long-output-192 (x2 averaged)"]


def _json(cmd, capsys):
    assert main(shlex.split(cmd) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("cmd, ranged", [
    ("fleet --config gemma-3-27b --gpu h200 --gpus 1 --requests 200 --input-tokens 600 --output-tokens 500",
     "wall_s_range"),
    ("step --config llama-3.1-8b --gpu h200 --phase decode --batch 32 --context 1000", "step_s_range"),
    ("simulate --config gemma-3-27b --gpu h200 --requests 50 --input-tokens 600 --output-tokens 500",
     "makespan_s_range"),
])
def test_json_carries_the_band(cmd, ranged, capsys):
    band = _json(cmd, capsys)["error_band"]
    assert {"regime", "band", "outside", "covers_query", "error", ranged} <= set(band)
    assert band["covers_query"] and band["band"]["count"] >= 1
    lo, hi = band[ranged]
    assert lo <= hi


def test_text_prints_the_band_and_says_outside(capsys):
    assert main(shlex.split("fleet --config llama-3.1-8b --gpu h100-sxm --gpus 2 --tp 2 --requests 100 "
                            "--input-tokens 100 --output-tokens 100")) == 0
    out = capsys.readouterr().out
    assert "OUTSIDE what was measured" in out and "H100" in out and "no band" in out
    assert main(shlex.split("step --config llama-3.1-8b --gpu h200 --phase decode --batch 32 --context 1000")) == 0
    assert "held-out band" in capsys.readouterr().out


def test_committed_error_bands_file_is_what_the_script_writes():
    spec = importlib.util.spec_from_file_location("fit_error_bands", ROOT / "scripts" / "fit_error_bands.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert ERROR_BANDS_FILE.read_text() == mod.text(), "run scripts/fit_error_bands.py and commit the file"


def test_held_out_rule_of_a_job():
    from servebook.hf_config import load_reference_config
    from servebook.lab.e2e.bands import job_group
    from servebook.provenance import config_sha256

    def doc(model_id, ref):
        return {"model_id": model_id, "config_sha256": config_sha256(load_reference_config(ref))}

    fitted = ["llama-3.1-8b"]
    here = Path("/x/e2e/e2e_m.json")
    # another run of a fitted model's config (a new id) is fitted
    assert job_group(here, doc("llama-3.1-8b-long", "llama-3.1-8b"), "j", None, fitted=fitted, sources=set())[0] == "fitted"
    # a record a calibration stage was fitted on is fitted, whatever its model
    assert job_group(here, doc("m", "gemma-3-27b"), "j", None, fitted=fitted, sources={"e2e/e2e_m.json"})[0] == "fitted"
    # a model a term was designed after is fitted
    assert job_group(here, doc("mixtral-8x7b-uniform", "mixtral-8x7b"), "j", None, fitted=fitted, sources=set())[0] == "fitted"
    # otherwise held out; a declaration written before the run decides for the jobs it lists
    assert job_group(here, doc("m", "gemma-3-27b"), "j", None, fitted=fitted, sources=set())[0] == "held out"
    declared = {"job": [{"record": "e2e_m", "job": "j", "group": "fitted"}]}
    assert job_group(here, doc("m", "gemma-3-27b"), "j", declared, fitted=fitted, sources=set())[0] == "fitted"
    assert job_group(here, doc("m", "gemma-3-27b"), "k", declared, fitted=fitted, sources=set())[0] == "held out"
