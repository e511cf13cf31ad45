"""The draft's 6.5 arithmetic, reproduced by hand from the draft's text (seed/serving-with-vllm-draft.txt)."""
from __future__ import annotations

import pytest

from servebook.draft.memory import (
    DRAFT_DEPLOYMENTS,
    GEMMA4_26B,
    GEMMA4_31B,
    draft_concurrency,
    draft_kv_budget_gib,
)
from servebook.hf_config import load_model_spec

GIB = 2**30


def test_the_drafts_weights_and_kv_per_token():
    # "For a 31B dense model, about 57.7 GiB. For the 26B MoE it is about 48.4 GiB" (draft 6.5)
    assert GEMMA4_31B.weight_bytes() / GIB == pytest.approx(57.7, abs=0.05)
    assert GEMMA4_26B.weight_bytes() / GIB == pytest.approx(48.4, abs=0.05)
    assert GEMMA4_31B.kv_bytes_per_token() == 2 * 48 * 8 * 128 * 2 == 192 * 1024
    assert GEMMA4_26B.kv_bytes_per_token() == 2 * 40 * 8 * 128 * 2 == 160 * 1024


def test_the_drafts_report_numbers_by_hand():
    # TP=1: 96 x 0.92 - 31e9 x 2 / 2**30 - 3 = 27.58 GiB; / (192 KiB x 15,000) = 10.04 sequences
    assert draft_kv_budget_gib(GEMMA4_31B) == pytest.approx(88.32 - 62e9 / GIB - 3)
    assert draft_concurrency(GEMMA4_31B, 15_000) == pytest.approx((88.32 - 62e9 / GIB - 3) * GIB / (196608 * 15000))
    assert round(draft_concurrency(GEMMA4_31B, 15_000)) == 10
    # TP=4 aggregate: 96 x 0.92 x 4 - 48.43 - 12 = 292.85 GiB for the 26B; / (160 KiB x 16,384) = 117 sequences
    assert draft_kv_budget_gib(GEMMA4_26B, tp=4) == pytest.approx(353.28 - 52e9 / GIB - 12)
    assert draft_concurrency(GEMMA4_26B, 16_384, tp=4) == pytest.approx((353.28 - 52e9 / GIB - 12) * GIB / (163840 * 16384))


def test_the_drafts_30k_deployment_halves_a_bf16_figure_although_it_turns_fp8_on():
    d15, d30 = DRAFT_DEPLOYMENTS
    assert d30.kv_cache_dtype == "fp8" and d15.kv_cache_dtype == "auto"
    assert d30.max_num_seqs * 2 == d15.max_num_seqs  # 54 = 108 / 2: sized as if still bf16 (errata 5)


def test_the_real_configs_are_not_the_drafts_shapes():
    # Errata 1: Gemma 4 31B has 60 layers (50 sliding, 10 global), 26B-A4B has 30.
    assert load_model_spec(GEMMA4_31B.reference_id).num_layers == 60 != GEMMA4_31B.layers
    assert load_model_spec(GEMMA4_26B.reference_id).num_layers == 30 != GEMMA4_26B.layers
