"""servebook.lab.harness.prefix: the workload builder and the prefix-cache hit rule, on hand-worked cases.

No engine: every expected value is worked out by hand in the comments from vLLM 0.27.1's rule
(full blocks only, chained hashes, lookup capped at prompt - 1 tokens, LRU free queue with
partly filled blocks at its front). tests/engine/test_lab_l6.py checks the rule against the engine.
"""
from __future__ import annotations

import itertools

import pytest

from servebook.lab.errors import LabError
from servebook.lab.harness.prefix import (PrefixWorkload, block_keys, build_prompts, offline_requests,
                                          predict_prefix_cache, shared_prefix_hit_tokens)


# ------------------------------------------------------------------------------------ workload
def test_system_prompt_workload_shares_exactly_the_system_prompt():
    w = PrefixWorkload(num_requests=5, system_prompt_tokens=20, suffix_tokens=7, output_tokens=3, seed=3)
    prompts = build_prompts(w)
    assert [len(p) for p in prompts] == [27] * 5
    assert all(p[:20] == prompts[0][:20] for p in prompts)
    assert len({p[20] for p in prompts}) == 5            # suffixes differ at their first token
    assert all(10 <= t < 512 for p in prompts for t in p)
    assert build_prompts(w) == prompts                   # seeded


def test_rag_workload_cycles_documents():
    w = PrefixWorkload(num_requests=5, system_prompt_tokens=4, suffix_tokens=2, output_tokens=1,
                       num_documents=2, document_tokens=6)
    p = build_prompts(w)
    assert w.prompt_tokens == 12 and [len(x) for x in p] == [12] * 5
    # documents 0, 1, 0, 1, 0 after the shared 4-token system prompt
    assert p[0][:10] == p[2][:10] == p[4][:10] and p[1][:10] == p[3][:10]
    assert p[0][:4] == p[1][:4] and p[0][4] != p[1][4]
    assert len({x[10] for x in p}) == 5


@pytest.mark.parametrize("kwargs, words", [
    (dict(num_requests=0), "num_requests"),
    (dict(suffix_tokens=0), "suffix_tokens"),
    (dict(num_documents=2, document_tokens=0), "document_tokens"),
    (dict(num_requests=600), "vocab_size"),               # 502 distinct first tokens in [10, 512)
])
def test_bad_shapes_say_what_to_change(kwargs, words):
    base = dict(num_requests=4, system_prompt_tokens=8, suffix_tokens=4, output_tokens=2)
    with pytest.raises(LabError, match=words):
        build_prompts(PrefixWorkload(**{**base, **kwargs}))


# ---------------------------------------------------------------------------------- block keys
def test_block_keys_cover_full_blocks_and_chain():
    a = list(range(10))                                   # 10 tokens, block 4: 2 full blocks
    assert len(block_keys(a, 4)) == 2
    b = a[:5] + [99] + a[6:]                              # differs in block 1 only
    assert block_keys(b, 4)[0] == block_keys(a, 4)[0] and block_keys(b, 4)[1] != block_keys(a, 4)[1]
    c = [99] + a[1:]                                      # differs in block 0: every key changes
    assert all(x != y for x, y in zip(block_keys(c, 4), block_keys(a, 4)))
    with pytest.raises(LabError, match="block"):
        block_keys(a, 0)


# ------------------------------------------------------------------------- unlimited cache rule
def test_only_whole_blocks_hit():
    shared = list(range(100, 107))                        # 7 shared tokens, block 4: 1 full block
    pred = predict_prefix_cache([shared + [1, 2], shared + [3, 4]], 4)
    assert pred.hit_tokens_per_request == (0, 4)
    assert pred.query_tokens == 18 and pred.hit_tokens == 4 and pred.prefill_tokens_computed == 14
    assert pred.hit_rate == pytest.approx(4 / 18)
    short = list(range(100, 103))                         # 3 shared tokens: less than a block
    assert predict_prefix_cache([short + [1], short + [2]], 4).hit_tokens == 0


def test_a_fully_cached_prompt_recomputes_its_last_block():
    p8 = list(range(20, 28))                              # exactly 2 blocks of 4
    # The lookup stops at 8 - 1 = 7 tokens: 1 full block, the second block is recomputed.
    assert predict_prefix_cache([p8, p8], 4).hit_tokens_per_request == (0, 4)
    p9 = p8 + [50]                                        # 9 tokens: both full blocks fit in 8
    assert predict_prefix_cache([p9, p9], 4).hit_tokens_per_request == (0, 8)


def test_system_prompt_workload_by_hand():
    # 8 requests, system prompt 384 tokens = 3 blocks of 128, suffix 64: first misses, 7 x 384 hit.
    w = PrefixWorkload(num_requests=8, system_prompt_tokens=384, suffix_tokens=64, output_tokens=8)
    pred = predict_prefix_cache(build_prompts(w), 128)
    assert pred.hit_tokens == 2688 and pred.query_tokens == 3584 and pred.hit_rate == 0.75
    # 400 shared tokens: still 3 full blocks; the 16 tokens past the last full block are recomputed.
    w400 = PrefixWorkload(num_requests=8, system_prompt_tokens=400, suffix_tokens=48, output_tokens=8)
    assert predict_prefix_cache(build_prompts(w400), 128).hit_tokens == 2688


def test_rag_workload_by_hand():
    # System 100 + document 200 + question 10, block 64, 3 documents, 7 requests (documents 0,1,2,0,1,2,0).
    # Requests 1 and 2 open a new document: hit floor(100/64) = 1 block = 64. Requests 3..6 hit
    # floor(300/64) = 4 blocks = 256. Request 0 misses.
    w = PrefixWorkload(num_requests=7, system_prompt_tokens=100, suffix_tokens=10, output_tokens=1,
                       num_documents=3, document_tokens=200)
    pred = predict_prefix_cache(build_prompts(w), 64)
    assert pred.hit_tokens_per_request == (0, 64, 64, 256, 256, 256, 256)
    assert shared_prefix_hit_tokens(w, 64) == 2 * 64 + 4 * 256


@pytest.mark.parametrize("n, system, docs, doc_len, suffix, block", list(itertools.product(
    (1, 2, 9), (0, 5, 16, 40), (0, 1, 3), (7, 32), (1, 20), (4, 16))))
def test_closed_form_agrees_with_the_rule(n, system, docs, doc_len, suffix, block):
    w = PrefixWorkload(num_requests=n, system_prompt_tokens=system, suffix_tokens=suffix, output_tokens=1,
                       num_documents=docs, document_tokens=doc_len if docs else 0, seed=n + system)
    assert predict_prefix_cache(build_prompts(w), block).hit_tokens == shared_prefix_hit_tokens(w, block)


# ------------------------------------------------------------------------------ a small pool
X = [1, 2, 3, 4, 5, 6, 7, 8]                              # two full blocks of 4
Y = [11, 12, 13, 14, 15, 16, 17, 18]
X1, X2, Y1 = X + [100], X + [101], Y + [102]              # 9 tokens + 1 output - 1 = 9 written: 3 blocks


def test_pool_that_holds_both_prefixes_keeps_them():
    # 5 free blocks: X1 takes 0,1,2 (2 cached, 2 partial) -> free queue [2,3,4,1,0]; Y1 takes 2,3,4;
    # X's blocks 0,1 survive, so X2 hits both.
    assert predict_prefix_cache([X1, Y1, X2], 4, pool_blocks=5).hit_tokens_per_request == (0, 0, 8)


def test_shuffled_order_evicts_grouped_order_does_not():
    # 4 free blocks. X1 takes 0,1,2 -> queue [2,3,1,0]. Y1 takes 2,3,1: X's second block (1) is
    # evicted, so X2 hits only X's first block. Grouped (X1, X2, Y1): X2 comes before the eviction.
    assert predict_prefix_cache([X1, Y1, X2], 4, pool_blocks=4).hit_tokens_per_request == (0, 0, 4)
    assert predict_prefix_cache([X1, X2, Y1], 4, pool_blocks=4).hit_tokens_per_request == (0, 8, 0)
    # Unlimited cache: order does not matter.
    assert predict_prefix_cache([X1, Y1, X2], 4).hit_tokens == predict_prefix_cache([X1, X2, Y1], 4).hit_tokens == 8


def test_partly_filled_blocks_are_reused_first():
    # 5 free blocks. X1 -> queue [2,3,4,1,0] (partial block 2 in front). S (2 tokens, 1 block) takes
    # 2 and puts it back in front. Y1 takes 2,3,4 and leaves X's blocks 1,0 alone: X2 hits 8.
    # (Were freed blocks appended in order regardless, S would take 3, Y1 would take 4,2,1 and
    # evict X's second block: X2 would hit 4.)
    S = [50, 51]
    assert predict_prefix_cache([X1, S, Y1, X2], 4, pool_blocks=5).hit_tokens_per_request == (0, 0, 0, 8)


def test_request_larger_than_the_pool_is_refused():
    with pytest.raises(LabError, match="pool"):
        predict_prefix_cache([X1], 4, pool_blocks=2)


def test_offline_requests_carry_the_token_ids():
    reqs = offline_requests([[5, 6, 7], [8]], 3, id_prefix="q")
    assert [r.id for r in reqs] == ["q000000", "q000001"] and [r.line for r in reqs] == [1, 2]
    assert reqs[0].prompt_token_ids == (5, 6, 7) and reqs[1].max_tokens == 3
    assert reqs[0].sampling == {"temperature": 0, "ignore_eos": True}
