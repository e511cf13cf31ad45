"""The simulator's per-step clock (PerfStepTime: StepPricer and PrefillWork on Python floats, a
table of per-context decode work) gives the numbers servebook.perf gives through its general
path -- step_time of summed prefill_work/decode_work -- and through its vectorised evaluation
over numpy arrays (step_seconds, as calibration runs it), to 1e-12, over a grid of steps:
prefill chunks after a cached prefix, decodes at varied contexts, CUDA-graph and eager sizes,
TP > 1, fp8 KV, a MoE model and a model with sliding-window layers."""
from dataclasses import replace

import numpy as np
import pytest

from perf_fixtures import KNOWN
from servebook.hf_config import load_model_spec
from servebook.perf import calibrated_coefficients, gpu_numbers
from servebook.perf import work as W
from servebook.perf.model import StepPricer, step_seconds, step_time
from servebook.simulator.step_time import PerfStepTime

GPU = gpu_numbers("h200")
CALIBRATED, _ = calibrated_coefficients(GPU.name)
# Test inputs with every term switched on (per-layer and eager launch costs, calibrated all-reduce).
ALL_TERMS = replace(KNOWN, per_layer_overhead_s=1e-5, eager_layer_s=2e-4, allreduce_latency_s=1.5e-5, link_eff=0.6)

RNG = np.random.default_rng(7)
CHUNKS = [(1, 0, True), (17, 0, True), (300, 64, True), (512, 0, False), (512, 1024, False), (513, 1023, True),
          (176, 1024, True), (2048, 20000, False), (8192, 0, True), (1000, 5000, True)]
STEPS = (
    # decodes only: one sequence, small batches, a CUDA-graph-sized batch, a batch past the graph limit
    [([], [0]), ([], [1]), ([], [17, 300, 2048]), ([], list(range(100, 356))), ([], list(range(600)))]
    + [([], RNG.integers(0, 30000, size=k).tolist()) for k in (5, 64, 512)]
    # prefill chunks alone (with and without a cached prefix, last chunk of a prompt or not)
    + [([c], []) for c in CHUNKS]
    # several chunks in one step, and chunks mixed with decodes
    + [(CHUNKS[2:5], []), ([CHUNKS[2]], [1, 4000]), ([CHUNKS[6], CHUNKS[0]], RNG.integers(0, 20000, 200).tolist()),
       ([CHUNKS[7]], RNG.integers(0, 30000, 40).tolist())]
)
CASES = [  # model, TP, KV dtype, CUDA-graph limit (0: every step eager), coefficients
    ("llama-3.1-8b", 1, "auto", 512, CALIBRATED),
    ("llama-3.1-8b", 2, "fp8", 512, CALIBRATED),
    ("llama-3.1-8b", 8, "auto", 0, ALL_TERMS),
    ("qwen3-30b-a3b", 1, "auto", 512, CALIBRATED),
    ("qwen3-30b-a3b", 4, "auto", 256, ALL_TERMS),
    ("gemma-4-31b", 2, "auto", 512, ALL_TERMS),
]


def _general_work(spec, tp, dtype, chunks, contexts):
    """The step's Work through servebook.perf's public functions (decodes as one batch with a
    context distribution, not per sequence)."""
    work = W.Work()
    if contexts:
        work = W.decode_work(spec, len(contexts), np.asarray(contexts, dtype=float), tp=tp, kv_cache_dtype=dtype)
    for n, prior, last in chunks:
        work = work + W.prefill_work(spec, n, prior_tokens=prior, tp=tp, kv_cache_dtype=dtype, last_chunk=last)
    return work


def _array_terms(spec, tp, cg, coeffs, works, dtype="auto"):
    """step_seconds over numpy arrays of the works, built the way calibration builds its rows."""
    tokens = np.array([w.tokens for w in works], dtype=float)
    col = lambda name: np.array([getattr(w, name) for w in works], dtype=float)  # noqa: E731
    return step_seconds(GPU, coeffs, weight_bytes=np.full(len(works), W.dense_weight_bytes_read(spec, tp)),
                        expert_bytes=W.expert_weight_bytes_read(spec, tokens, tp), tokens=tokens,
                        sequences=col("sequences"), linear_flops=col("linear_flops"),
                        kv_read_bytes=col("kv_read_bytes"), attention_flops=col("attention_flops"),
                        allreduces=np.full(len(works), W.allreduce_count(spec, tp)),
                        allreduce_bytes_each=W.allreduce_bytes(spec, tokens, tp), tp=tp,
                        expert_flops=col("expert_flops"), expert_rows=W.tokens_per_touched_expert(spec, tokens),
                        expert_size=np.full(len(works), W.expert_gemm_size(spec, tp)),
                        layers=np.full(len(works), spec.num_layers),
                        moe_layers=np.full(len(works), len(spec.moe.moe_layer_indices) if spec.moe else 0),
                        eager=tokens > cg, piecewise=tokens - col("sampled_tokens") >= 0.5,
                        mla_layers=np.full(len(works), sum(1 for layer in spec.layers if layer.kind == "mla")),
                        kv_dtype_bytes=W.kv_dtype_bytes(dtype))


@pytest.mark.parametrize("model,tp,dtype,cg,coeffs", CASES, ids=[f"{m}-tp{t}-{d}-cg{g}" for m, t, d, g, _ in CASES])
def test_simulator_clock_equals_the_general_and_the_vectorised_step_time(model, tp, dtype, cg, coeffs):
    spec = load_model_spec(model)
    clock = PerfStepTime(spec, GPU, coeffs, tp=tp, kv_cache_dtype=dtype, cudagraph_max_tokens=cg)
    fast = [clock.step_s(chunks, contexts) for chunks, contexts in STEPS]
    works = [_general_work(spec, tp, dtype, chunks, contexts) for chunks, contexts in STEPS]
    general = [step_time(spec, GPU, w, coeffs, tp=tp, cudagraph_max_tokens=cg, kv_cache_dtype=dtype).step_s
               for w in works]
    assert fast == pytest.approx(general, rel=1e-12)
    arrays = _array_terms(spec, tp, cg, coeffs, works, dtype)
    assert fast == pytest.approx(arrays["step_s"].tolist(), rel=1e-12)
    # The grid reaches both sides of every switch: eager and CUDA-graph steps, compute- and memory-bound.
    eager = [w.tokens > cg for w in works]
    assert any(eager) and (cg == 0 or not all(eager))
    assert arrays["compute_bound"].any() and not arrays["compute_bound"].all()
    if tp > 1:
        assert (arrays["allreduce_s"] > 0).all()


@pytest.mark.parametrize("model,tp,dtype,cg,coeffs", CASES, ids=[f"{m}-tp{t}-{d}-cg{g}" for m, t, d, g, _ in CASES])
def test_every_term_on_floats_equals_the_term_on_arrays(model, tp, dtype, cg, coeffs):
    spec = load_model_spec(model)
    works = [_general_work(spec, tp, dtype, chunks, contexts) for chunks, contexts in STEPS]
    arrays = _array_terms(spec, tp, cg, coeffs, works, dtype)
    pricer = StepPricer(spec, GPU, coeffs, tp=tp, cudagraph_max_tokens=cg, kv_cache_dtype=dtype)
    for i, w in enumerate(works):
        floats = pricer.terms(*w.astuple())
        assert isinstance(floats["step_s"], float)  # the float path made no numpy call
        for name in ("step_s", "overhead_s", "linear_s", "attention_s", "allreduce_s", "eager_extra_s"):
            assert floats[name] == pytest.approx(float(arrays[name][i]), rel=1e-12, abs=1e-18), (name, i)
        assert floats["compute_bound"] == bool(arrays["compute_bound"][i])
        assert floats["expert_bytes"] == pytest.approx(float(W.expert_weight_bytes_read(spec, w.tokens, tp)),
                                                       rel=1e-12)


def test_causal_keys_on_numbers_equals_causal_keys_on_arrays():
    prior = np.array([0, 1, 100, 511, 512, 1023, 1024, 1025, 4096, 30000], dtype=float)
    new = np.array([1, 2, 17, 512, 513, 1000, 2048, 8192], dtype=float)
    p, n = (a.ravel() for a in np.meshgrid(prior, new))
    for window in (None, 1, 512, 1024, 4096):
        arrays = W.causal_keys(p, n, window)
        numbers = [W.causal_keys(int(a), int(b), window) for a, b in zip(p, n)]
        assert all(isinstance(x, float) for x in numbers)
        assert numbers == pytest.approx(arrays.tolist(), rel=1e-15)


def test_the_clock_refuses_an_empty_step_and_a_negative_context():
    from servebook.errors import ServebookError

    clock = PerfStepTime(load_model_spec("llama-3.1-8b"), GPU, CALIBRATED)
    with pytest.raises(ServebookError, match="at least one"):
        clock.step_s([], [])
    with pytest.raises(ServebookError, match="context must be >= 0"):
        clock.step_s([], [5, -1])
