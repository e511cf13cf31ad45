"""The simulator's integer shortcuts give the same floats as adding the step-model's terms one by one.

``PerfStepTime`` sums its decoders' work from three integer sums (``_DecodeSums``), and ``PrefillWork``
sums a chunk's attention FLOPs and KV bytes per group of equal layers in integers. Both rest on one
fact: whole numbers below 2**53 add exactly in floats, in any order. These tests compare each shortcut,
bit for bit, with the per-layer / per-decoder float loop it replaces, on every reference model at
several TP sizes and KV dtypes, and check that the shortcut is taken for them (else the speed is gone).
"""
from __future__ import annotations

import random

import pytest

from servebook.hf_config import load_model_spec, reference_model_ids
from servebook.perf import calibrated_coefficients, gpu_numbers
from servebook.perf.work import PrefillWork, decode_work
from servebook.simulator.step_time import PerfStepTime, _DecodeSums

GPU = gpu_numbers("h200")
COEFFS, _ = calibrated_coefficients(GPU.name)
CASES = [(model, tp, kv) for model in reference_model_ids() for tp, kv in ((1, "auto"), (2, "fp8"), (8, "auto"))]


def _tp_fits(spec, tp):
    return spec.num_attention_heads % tp == 0


@pytest.mark.parametrize("model,tp,kv", CASES)
def test_decode_sums_equal_the_per_decoder_float_sum(model, tp, kv):
    spec = load_model_spec(model)
    if not _tp_fits(spec, tp):
        pytest.skip(f"{model} does not split {spec.num_attention_heads} heads over tp={tp}")

    def row(c):
        return decode_work(spec, 1, float(c), tp=tp, kv_cache_dtype=kv).astuple()

    sums = _DecodeSums.for_model(spec, tp, kv, row)
    assert sums, f"{model} tp={tp} {kv}: the integer shortcut is not taken"
    rng = random.Random(f"{model}{tp}{kv}")
    windows = sorted({layer.sliding_window for layer in spec.layers if layer.sliding_window})
    for size in (1, 7, 256, 1024):
        contexts = [rng.choice([rng.randrange(0, 40000), *(w + d for w in windows for d in (-1, 0, 1))])
                    for _ in range(size)]
        by_row = [sum(col) for col in zip(*(row(c) for c in contexts))]
        assert sums(contexts) == by_row
        assert sums(contexts, sum(contexts)) == by_row  # the simulator hands over the total it added up


def test_decode_sums_step_aside_for_float_contexts_and_huge_sums():
    spec = load_model_spec("llama-3.1-8b")
    sums = _DecodeSums.for_model(spec, 1, "auto", lambda c: decode_work(spec, 1, float(c)).astuple())
    assert sums([10, 20.5]) is None
    assert sums([2 ** 40] * 4) is None  # KV bytes past 2**53: the caller adds floats as before
    model = PerfStepTime(spec, GPU, COEFFS)
    assert model.step_s([], [10, 20.5]) == model.step_s([], [10.0, 20.5])  # the table path still works


@pytest.mark.parametrize("model,tp,kv", CASES)
def test_prefill_integer_groups_equal_the_per_layer_float_sum(model, tp, kv):
    spec = load_model_spec(model)
    if not _tp_fits(spec, tp):
        pytest.skip(f"{model} does not split {spec.num_attention_heads} heads over tp={tp}")
    fast = PrefillWork(spec, tp=tp, kv_cache_dtype=kv)
    slow = PrefillWork(spec, tp=tp, kv_cache_dtype=kv)
    slow.groups = None
    assert fast.groups, f"{model} tp={tp} {kv}: the integer shortcut is not taken"
    rng = random.Random(f"{model}{tp}{kv}")
    windows = sorted({layer.sliding_window for layer in spec.layers if layer.sliding_window})
    points = [(1, 0), (8192, 0), (8192, 8192), (4096, 120000)]
    points += [(rng.randrange(1, 9000), rng.choice([0, rng.randrange(0, 60000), *windows])) for _ in range(200)]
    points += [(n, w + d) for w in windows for n in (1, 3, 500) for d in (-600, -2, -1, 0, 1)]
    for n, p in points:
        for last in (True, False):
            assert fast(n, max(p, 0), last) == slow(n, max(p, 0), last), (n, p, last)
