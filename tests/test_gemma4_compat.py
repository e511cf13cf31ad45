"""servebook.lab.harness.gemma4_compat: the lent image's Gemma 4 workaround (vLLM 0.26.0 + transformers 5.17),
in one place for gpu_record.py (and kv_groups_probe.py through it) and the end-to-end child."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from servebook.hf_config import load_reference_config
from servebook.lab.e2e.child import engine_inputs
from servebook.lab.e2e.plan import load_plan
from servebook.lab.harness import gemma4_compat as g4
from servebook.provenance import config_sha256
from servebook.tiny_model import language_model_config

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "labs" / "results"
#: The start-up record made with the overrides (gpu_record.py startup, 2026-12-04).
OVERRIDES_RECORD = RESULTS / "startup_logs" / "h200-vllm0.26.0-2026-12-04-gemma4-overrides.json"
E2E_RECORD = RESULTS / "e2e_gemma4_26b" / "e2e_gemma-4-26b-a4b-uniform.json"
E2E_PLAN = ROOT / "labs" / "tools" / "e2e_gemma4_26b.toml"


def _text_config(model_id: str) -> dict:
    return language_model_config(load_reference_config(model_id))


def _gpu_record():
    spec = importlib.util.spec_from_file_location("gpu_record_under_test", ROOT / "labs" / "tools" / "gpu_record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recorded_cases() -> list[dict]:
    return json.loads(OVERRIDES_RECORD.read_text())["cases"]


# ---- the flag -------------------------------------------------------------------------------------
def test_the_flag_is_added_to_a_gemma4_text_config_that_lacks_it():
    cfg = _text_config("gemma-4-26b-a4b")
    assert cfg["model_type"] == "gemma4_text" and g4.FLAG not in cfg
    out, notes = g4.engine_config(cfg)
    assert out[g4.FLAG] is True and notes == [g4.FLAG_NOTE]
    assert g4.FLAG not in cfg, "the caller's config is not modified"
    assert {k: v for k, v in out.items() if k != g4.FLAG} == cfg


@pytest.mark.parametrize("value", [True, False])
def test_a_gemma4_text_config_that_has_the_flag_comes_back_unchanged(value):
    cfg = dict(_text_config("gemma-4-26b-a4b"), **{g4.FLAG: value})
    out, notes = g4.engine_config(cfg)
    assert out is cfg and notes == []


@pytest.mark.parametrize("model_id", ["llama-3.1-8b", "gemma-3-27b"])
def test_other_configs_get_no_flag_and_no_overrides(model_id):
    cfg = _text_config(model_id)
    out, notes = g4.engine_config(cfg)
    assert out is cfg and notes == [] and g4.FLAG not in out
    assert g4.hf_overrides(cfg) == {}
    args = {"max_model_len": 4096}
    assert g4.engine_args_with_overrides(args, cfg) == (args, [])


def test_the_multimodal_wrapper_is_not_a_gemma4_text_config():
    """Only the text tower (what the recorders load) is adjusted."""
    wrapper = load_reference_config("gemma-4-26b-a4b")
    assert wrapper["model_type"] == "gemma4"
    assert g4.engine_config(wrapper) == (wrapper, []) and g4.hf_overrides(wrapper) == {}


# ---- the overrides, against what the recorded engines used ----------------------------------------
def test_overrides_are_what_the_recorded_gemma4_startups_used():
    cases = _recorded_cases()
    assert {c["model_id"] for c in cases} == {"gemma-4-26b-a4b", "gemma-4-31b"}
    for case in cases:
        recorded = case["engine_args"]["hf_overrides"]
        assert g4.hf_overrides(case["config"]) == recorded
        assert g4.hf_overrides(_text_config(case["model_id"])) == recorded
    by_name = {c["name"]: c for c in cases}
    assert by_name["gemma-4-26b-a4b--eager16k"]["engine_args"]["hf_overrides"] == {
        "num_global_key_value_heads": 2, "global_head_dim": 512}


@pytest.mark.parametrize("folder", ["h200-0.26.0-gemma-4-26b-a4b--eager16k",
                                    "h200-0.26.0-gemma-4-26b-a4b--eager16k-b4k"])
def test_overrides_are_what_the_shipped_gemma4_26b_startup_logs_used(folder):
    flags = json.loads((ROOT / "src" / "servebook" / "data" / "startup_logs" / folder / "flags.json").read_text())
    assert g4.hf_overrides(_text_config("gemma-4-26b-a4b")) == flags["engine_kwargs"]["hf_overrides"]


def test_the_engine_config_is_the_one_the_records_name():
    """Flag added to the shipped text config = the config (and sha256) the start-ups, the e2e job and its
    held-out declaration name, and the plan's hand-edited config file."""
    cfg, _ = g4.engine_config(_text_config("gemma-4-26b-a4b"))
    sha = config_sha256(cfg)
    assert sha == next(c for c in _recorded_cases() if c["model_id"] == "gemma-4-26b-a4b")["config_sha256"]
    assert sha == json.loads(E2E_RECORD.read_text())["config_sha256"]
    assert sha == config_sha256(json.loads((ROOT / "labs" / "tools" / "models" / "gemma-4-26b-a4b-text.json")
                                           .read_text()))


# ---- merging into engine flags --------------------------------------------------------------------
def test_overrides_are_added_to_flags_that_lack_them():
    cfg, _ = g4.engine_config(_text_config("gemma-4-26b-a4b"))
    args = {"enforce_eager": True}
    out, notes = g4.engine_args_with_overrides(args, cfg)
    assert out == {"enforce_eager": True, "hf_overrides": {"num_global_key_value_heads": 2, "global_head_dim": 512}}
    assert args == {"enforce_eager": True}, "the caller's flags are not modified"
    assert notes == [g4.overrides_note(out["hf_overrides"])]


def test_an_explicit_value_equal_to_the_computed_one_changes_nothing():
    cfg = _text_config("gemma-4-26b-a4b")
    args = {"hf_overrides": {"num_global_key_value_heads": 2, "global_head_dim": 512}}
    out, notes = g4.engine_args_with_overrides(args, cfg)
    assert out is args and notes == []


def test_an_explicit_value_wins_key_by_key_and_is_noted():
    cfg = _text_config("gemma-4-26b-a4b")
    args = {"hf_overrides": {"num_global_key_value_heads": 8, "other": 1}}
    out, notes = g4.engine_args_with_overrides(args, cfg)
    assert out["hf_overrides"] == {"num_global_key_value_heads": 8, "other": 1, "global_head_dim": 512}
    assert notes[0] == g4.overrides_note({"global_head_dim": 512})
    assert "num_global_key_value_heads=8 kept" in notes[1] and "config says 2" in notes[1]


# ---- gpu_record.py ------------------------------------------------------------------------------
def test_gpu_record_makes_the_recorded_gemma4_cases_again():
    gpu_record = _gpu_record()
    for recorded in _recorded_cases():
        model, profile = recorded["name"].split("--")
        case = gpu_record.make_case(recorded["name"], model, gpu_record.STARTUP_ARGS[profile])
        assert case == {k: recorded[k] for k in case}
        assert list(case) == ["name", "model_id", "config", "config_sha256", "engine_args", "timing",
                              "config_adjustment"]


def test_gpu_record_leaves_other_models_alone():
    case = _gpu_record().make_case("llama-3.1-8b--eager", "llama-3.1-8b", {"enforce_eager": True})
    assert case["engine_args"] == {"enforce_eager": True} and "config_adjustment" not in case


def test_run_child_returns_the_last_marked_result_and_the_log(tmp_path):
    """The shared child runner of gpu_record.py and kv_groups_probe.py (stderr after stdout when apart)."""
    gpu_record = _gpu_record()
    script = tmp_path / "child.py"
    script.write_text("import json, os, sys\n"
                      "case = json.load(open(sys.argv[2]))\n"
                      "print('MARK ' + json.dumps({'n': 1}), flush=True)\n"
                      "print('oops', file=sys.stderr, flush=True)\n"
                      "print('MARK ' + json.dumps({'n': case['n'], 'env': os.environ.get('X_TEST')}), flush=True)\n")
    run = gpu_record.run_child(str(script), {"n": 7}, 30, "MARK ", env={"X_TEST": "y"}, merge_stderr=False)
    assert run["returncode"] == 0 and run["result"] == {"n": 7, "env": "y"}
    assert run["log"].endswith("oops\n") and list(run) == ["returncode", "wall_s", "log", "result"]
    merged = gpu_record.run_child(str(script), {"n": 7}, 30, "MARK ")
    assert "oops" in merged["log"] and merged["result"] == {"n": 7, "env": None}
    script.write_text("import time\ntime.sleep(30)\n")
    late = gpu_record.run_child(str(script), {}, 0.5, "MARK ")
    assert late["returncode"] == "timeout" and late["result"] is None


# ---- the end-to-end child -------------------------------------------------------------------------
def _e2e_case(model_plan) -> dict:
    return {"model": model_plan.model, "config": model_plan.config(), "engine_args": model_plan.engine_args}


def test_the_committed_gemma4_plan_starts_the_recorded_engine_unchanged():
    """The plan's hand-edited config and hand-written overrides (named by its held-out declaration) are
    tolerated: the computed values equal them, so nothing is added or noted."""
    case = _e2e_case(load_plan(E2E_PLAN).model("gemma-4-26b-a4b-uniform"))
    config, args, notes = engine_inputs(case)
    assert config is case["config"] and args == case["engine_args"] and notes == []
    recorded = json.loads(E2E_RECORD.read_text())
    assert args["hf_overrides"] == recorded["engine_args"]["hf_overrides"]
    assert "config_adjustment" not in recorded


def test_a_plan_with_neither_flag_nor_overrides_gets_the_same_engine(tmp_path):
    text = E2E_PLAN.read_text().replace(
        "engine = { attention_backend = \"TRITON_ATTN\", hf_overrides = { num_global_key_value_heads = 2, "
        "global_head_dim = 512 } }", "engine = { attention_backend = \"TRITON_ATTN\" }")
    assert "hf_overrides =" not in text
    text = text.replace('config = "models/gemma-4-26b-a4b-text.json"\n', 'config_model = "gemma-4-26b-a4b"\n')
    (tmp_path / "plan.toml").write_text(text)
    case = _e2e_case(load_plan(tmp_path / "plan.toml").model("gemma-4-26b-a4b-uniform"))
    assert g4.FLAG not in case["config"] and "hf_overrides" not in case["engine_args"]
    config, args, notes = engine_inputs(case)
    recorded = json.loads(E2E_RECORD.read_text())
    assert config_sha256(config) == recorded["config_sha256"]
    assert {k: args[k] for k in case["engine_args"]} == case["engine_args"]
    assert args["hf_overrides"] == recorded["engine_args"]["hf_overrides"]
    assert notes == [g4.FLAG_NOTE, g4.overrides_note(args["hf_overrides"])]


def test_the_e2e_child_passes_other_models_through():
    case = {"model": "llama-3.1-8b", "config": _text_config("llama-3.1-8b"), "engine_args": {"max_model_len": 8192}}
    config, args, notes = engine_inputs(case)
    assert config is case["config"] and args == case["engine_args"] and notes == []

