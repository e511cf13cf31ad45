"""Drift test: every vLLM fact the book names holds in the installed vLLM (the pinned release, PINNED_VLLM).

The facts are data (src/servebook/data/vllm_claims.toml): flags and their defaults (checked with
vLLM's own ``vllm serve`` argument parser), config-dataclass defaults, runtime defaults (source
and, for batch defaults, vLLM's own function), Prometheus metric names and log-line formats.
tests/test_book_claims.py makes sure the pages name nothing that is not in that file. Here, too,
every ``vllm serve`` command the book prints (literal fenced commands and the ones the pages build
with ``servebook plan``) must parse with vLLM's parser. Runs in the shared vLLM probe (vllm_probe.py); no engine.
"""
from __future__ import annotations

import importlib.util
import json
import shlex
import tomllib
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.vllm_env]   # vLLM's Python, no engine start

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CLAIMS_PATH = ROOT / "src" / "servebook" / "data" / "vllm_claims.toml"
CHECKER = HERE / "vllm_claims_check.py"


def _scanner():
    spec = importlib.util.spec_from_file_location("book_claims_scanner", ROOT / "tests" / "test_book_claims.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CLAIMS = tomllib.loads(CLAIMS_PATH.read_text())
KINDS = ("flag", "default", "runtime_default", "metric", "log", "parse")


def _ids() -> list[str]:
    import sys

    sys.path.insert(0, str(HERE))
    try:
        from vllm_claims_check import claim_id
    finally:
        sys.path.pop(0)
    return [claim_id(kind, e) for kind in KINDS for e in CLAIMS.get(kind, [])]


def plan_commands() -> dict[str, list[str]]:
    """argv after ``vllm serve`` of each command the pages build with servebook plan."""
    from servebook import make_plan

    out = {}
    for entry in CLAIMS.get("plan_command", []):
        kwargs = {k: v for k, v in entry.items() if k not in ("id", "section", "config")}
        argv = shlex.split(make_plan(entry["config"], **kwargs).serve_command())
        assert argv[:2] == ["vllm", "serve"]
        out[entry["id"]] = argv[2:]
    return out


def tune_commands() -> dict[str, list[str]]:
    """argv after ``vllm serve`` of lines servebook tune prints: its defaults pick, and one whose flags changed."""
    from servebook.simulator.online import OnlineWorkload
    from servebook.simulator.tune import LatencyTargets, tune

    out = {}
    for name, targets in (("defaults", LatencyTargets(ttft_s=1.0, tpot_s=0.05)),
                          ("tight", LatencyTargets(ttft_s=5.0, tpot_s=0.012, headroom=0.0))):
        r = tune("llama-3.1-8b", gpu="h200", max_gpus=2, workload=OnlineWorkload(20.0, 1024, 128, duration_s=10),
                 targets=targets, tps=(1,))
        picks = [r.best] if r.best else []
        picks += [c for c in r.tried if c.changed_flags][:2]
        for i, c in enumerate(picks):
            argv = shlex.split(c.serve_command())
            assert argv[:2] == ["vllm", "serve"]
            out[f"tune-{name}-{i}"] = argv[2:]
    # a shared prefix: the search tries prefix caching off, whose line carries --no-enable-prefix-caching
    r = tune("llama-3.1-8b", gpu="h200", max_gpus=1, targets=LatencyTargets(ttft_s=1.0, tpot_s=0.05), tps=(1,),
             workload=OnlineWorkload(5.0, 1024, 64, prefix_tokens=512, prefix_share=0.5, duration_s=10))
    off = next(c for c in r.tried if not c.prefix_caching)
    argv = shlex.split(off.serve_command())
    assert "--no-enable-prefix-caching" in argv
    out["tune-prefix-caching-off"] = argv[2:]
    return out


def literal_commands() -> dict[str, list[str]]:
    scanner = _scanner()
    out = {}
    for path in scanner.book_sources(ROOT):
        for i, argv in enumerate(scanner.serve_commands(path.read_text())):
            out[f"{path.relative_to(ROOT)}#{i}"] = argv
    return out


def run_checker(probe, tmp_path: Path, claims_text: str, argvs: list[list[str]]) -> dict:
    claims = tmp_path / "claims.toml"
    claims.write_text(claims_text)
    argv_file = tmp_path / "argv.json"
    argv_file.write_text(json.dumps(argvs))
    proc = probe.run(CHECKER, claims, argv_file)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_CLAIMS "))
    return json.loads(line.split(" ", 1)[1])


@pytest.fixture(scope="module")
def checked(vllm_probe, tmp_path_factory):
    commands = {**plan_commands(), **tune_commands(), **literal_commands()}
    got = run_checker(vllm_probe, tmp_path_factory.mktemp("claims"), CLAIMS_PATH.read_text(), list(commands.values()))
    got["commands"] = dict(zip(commands, got["argv"]))
    return got


def test_installed_vllm_is_the_pinned_release(checked):
    import servebook

    assert checked["version"] == CLAIMS["pinned"] == servebook.PINNED_VLLM


@pytest.mark.parametrize("claim", _ids())
def test_claim_holds_in_pinned_vllm(checked, claim):
    assert claim in checked["results"], f"{claim} was not checked"
    assert checked["results"][claim] is None, checked["results"][claim]


def test_every_printed_serve_command_parses(checked):
    assert len(checked["commands"]) >= len(CLAIMS.get("plan_command", []))
    bad = {k: v for k, v in checked["commands"].items() if v is not None}
    assert bad == {}


def test_checker_reports_planted_drift(vllm_probe, tmp_path):
    """The checker is not a rubber stamp: each kind of wrong claim is reported."""
    planted = """
pinned = "0.27.1"
[[flag]]
flag = "--max-num-sequences"
dest = "max_num_seqs"
[[flag]]
flag = "--gpu-memory-utilization"
dest = "gpu_memory_utilization"
parser_default = 0.9
[[flag]]
flag = "--max-num-seqs"
exists = false
[[default]]
config = "SchedulerConfig"
field = "enable_chunked_prefill"
value = false
[[default]]
config = "CacheConfig"
field = "no_such_field"
value = 1
[[runtime_default]]
name = "a line that is not there"
source_file = "config/vllm.py"
source_literal = "self.scheduler_config.async_scheduling = 'maybe'"
[[runtime_default]]
name = "batch defaults"
check = "batch_defaults"
expected = { h200 = [16384, 1024] }
source_file = "engine/arg_utils.py"
source_literal = "def get_batch_defaults("
[[metric]]
name = "vllm:num_preempted_requests"
source_file = "v1/metrics/loggers.py"
[[metric]]
name = "vllm:kv_cache_usage_perc"
kind = "counter"
source_file = "v1/metrics/loggers.py"
[[log]]
name = "renamed"
format = "KV cache size on GPU: %s tokens"
example = "KV cache size on GPU: 10 tokens"
source_file = "v1/core/kv_cache_utils.py"
[[parse]]
argv = ["m", "--max-model-len", "16k"]
dest = "max_model_len"
value = 16384
[[log]]
name = "bad example"
format = "GPU KV cache size: %s tokens"
example = "GPU KV cache size: 10 blocks"
source_file = "v1/core/kv_cache_utils.py"
"""
    got = run_checker(vllm_probe, tmp_path, planted, [["m", "--max-num-seqs", "many"], ["m", "--max-num-seqs", "8"]])
    results = got["results"]
    assert len(results) == 12
    assert "16000" in results["parse:--max-model-len 16k"]
    assert "gauge" in results["metric:vllm:kv_cache_usage_perc"]
    assert all(v is not None for v in results.values()), {k: v for k, v in results.items() if v is None}
    assert "0.92" in results["flag:--gpu-memory-utilization"]
    assert "16384" in results["runtime_default:batch defaults"] and "8192" in results["runtime_default:batch defaults"]
    assert got["argv"][0] is not None and got["argv"][1] is None
