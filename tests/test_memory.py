"""The memory budget: hand arithmetic, the does-not-fit advice, calibration on synthetic data."""
from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servebook.errors import DoesNotFitError, ServebookError
from servebook.memory import (ACTIVATION_FEATURES, DEFAULT_GPU_MEMORY_UTILIZATION, MemoryCoefficients,
                              load_coefficients, memory_budget, write_coefficients)
from servebook.memory_fit import CalibrationRecord, budget_from_log, calibrate, record_from_log
from servebook.model_spec import AttentionLayer, MoESpec, ModelSpec, ParamCount
from servebook.startup_log import parse_startup_log

GIB = 2**30
MIB = 2**20


def spec(*, layers=32, hidden=4096, inter=14336, heads=32, kv=8, hd=128, vocab=128256, weight_bytes=16 * 10**9,
         moe=None, architecture="HandMade"):
    return ModelSpec(
        name="hand-made",
        architecture=architecture,
        moe=moe,
        hidden_size=hidden,
        num_attention_heads=heads,
        vocab_size=vocab,
        max_position_embeddings=8192,
        layers=tuple(AttentionLayer("full", kv, hd, hd) for _ in range(layers)),
        params=ParamCount(0, 0, 0, 0, 0, 0, 0, 0),
        weight_bytes=weight_bytes,
        intermediate_size=inter,
    )


# Coefficients chosen for hand arithmetic: 1 GiB constant + 2 copies of the hidden states.
SIMPLE = MemoryCoefficients(
    activation={"constant_bytes": 1 * GIB, "hidden": 2.0, "mlp": 0.0, "moe_workspace": 0.0, "sampler": 0.0},
    non_torch_tp1_bytes=0.5 * GIB,
    non_torch_tp_gt1_bytes=1.5 * GIB,
    cudagraph_constant_bytes=0.0,
    cudagraph_per_layer_bytes=10 * MIB,
)


def test_default_utilization_is_0_92():
    assert DEFAULT_GPU_MEMORY_UTILIZATION == 0.92  # CacheConfig.gpu_memory_utilization, 0.26.0 and 0.27.1


def test_budget_by_hand():
    s = spec()
    total = 80 * GIB
    b = memory_budget(s, gpu_memory_bytes=total, max_num_batched_tokens=8192, max_num_seqs=256, coefficients=SIMPLE)
    requested = math.ceil(total * 0.92)
    weights = 16 * 10**9
    activation = 1 * GIB + 2 * 8192 * 4096 * 2  # 1 GiB + 2 copies of T x hidden x 2 bytes = 1.125 GiB
    non_torch = GIB // 2
    graphs = 0  # a dense decoder runs on vLLM's V2 model runner, whose graph estimate is 0
    assert b.requested_bytes == requested
    assert (b.weights_bytes, b.activation_bytes, b.non_torch_bytes, b.cudagraph_bytes) == (
        weights, activation, non_torch, graphs)
    assert b.available_kv_bytes == requested - weights - activation - non_torch - graphs
    assert b.available_kv_gib == pytest.approx(b.available_kv_bytes / GIB)
    assert b.claims() == {"weights": weights, "lora": 0, "peak_activation": activation, "non_torch": non_torch,
                          "cudagraph": graphs}


def test_tp_splits_weights_and_uses_the_multi_gpu_non_torch_figure():
    s = spec()
    b = memory_budget(s, gpu_memory_bytes=80 * GIB, max_num_batched_tokens=8192, max_num_seqs=256, tp=2, coefficients=SIMPLE)
    assert b.weights_bytes == 8 * 10**9
    assert b.non_torch_bytes == int(1.5 * GIB)


def moe_spec(architecture="Qwen3MoeForCausalLM"):
    moe = MoESpec(num_experts=64, experts_per_token=8, expert_intermediate_size=1024, num_shared_experts=0,
                  shared_intermediate_size=0, moe_layer_indices=tuple(range(32)), params_per_expert=0)
    return spec(moe=moe, architecture=architecture)


def test_a_v1_runner_moe_pays_the_graph_estimate_unless_eager():
    kw = dict(gpu_memory_bytes=80 * GIB, max_num_batched_tokens=2048, max_num_seqs=256, coefficients=SIMPLE)
    assert memory_budget(moe_spec(), **kw).cudagraph_bytes == 32 * 10 * MIB  # 32 layers x 10 MiB
    assert memory_budget(moe_spec(), enforce_eager=True, **kw).cudagraph_bytes == 0
    # DeepseekV2ForCausalLM is one of the MoE architectures vLLM 0.26.0/0.27.1 put on the V2 runner
    assert memory_budget(moe_spec("DeepseekV2ForCausalLM"), **kw).cudagraph_bytes == 0
    assert memory_budget(spec(), **kw).cudagraph_bytes == 0


def mxfp4_moe_spec():
    moe = MoESpec(num_experts=32, experts_per_token=4, expert_intermediate_size=2880, num_shared_experts=0,
                  shared_intermediate_size=0, moe_layer_indices=tuple(range(32)), params_per_expert=0,
                  bytes_per_param=17 / 32)
    return spec(hidden=2880, moe=moe, architecture="GptOssForCausalLM")


def test_mlp_bytes_per_token_by_hand():
    from servebook.memory import mlp_bytes_per_token

    assert mlp_bytes_per_token(spec(inter=14336)) == 3 * 14336 * 2
    assert mlp_bytes_per_token(spec(inter=14336), tp=2) == 3 * 7168 * 2
    # 16-bit experts: the routed caches live in the persistent workspace, not in the transient MLP term;
    # every layer is MoE and there is no shared expert, so nothing is left
    assert mlp_bytes_per_token(moe_spec()) == 0
    # MXFP4 experts (monolithic kernel): top-4 x (3 x 2880 + hidden 2880) x 2 bytes
    assert mlp_bytes_per_token(mxfp4_moe_spec()) == 4 * (3 * 2880 + 2880) * 2
    assert mlp_bytes_per_token(mxfp4_moe_spec(), tp=4) == 4 * (3 * 720 + 2880) * 2


def test_moe_workspace_by_hand():
    from servebook.memory import moe_workspace_bytes

    # TritonExperts: T x top-8 x (max(I, hidden) + max(2I, hidden)) x 2 bytes, I = 1024, hidden = 4096
    assert moe_workspace_bytes(moe_spec(), max_num_batched_tokens=2048) == 2048 * 8 * (4096 + 4096) * 2
    wide = spec(moe=MoESpec(num_experts=64, experts_per_token=6, expert_intermediate_size=3000, num_shared_experts=0,
                            shared_intermediate_size=0, moe_layer_indices=tuple(range(32)), params_per_expert=0))
    assert moe_workspace_bytes(wide, max_num_batched_tokens=100) == 100 * 6 * (4096 + 6000) * 2
    assert moe_workspace_bytes(wide, max_num_batched_tokens=100, tp=2) == 100 * 6 * (4096 + 4096) * 2
    assert moe_workspace_bytes(mxfp4_moe_spec(), max_num_batched_tokens=2048) == 0  # allocates in the kernel
    assert moe_workspace_bytes(spec(), max_num_batched_tokens=2048) == 0


def test_sampler_phase_by_hand_differs_between_the_runners():
    from servebook.memory import sampler_phase_bytes

    t, seqs, v, h = 4096, 1024, 128256, 4096
    common = t * h * 2 + seqs * h * 2 + seqs * v * 2   # output hidden states, gathered rows, bf16 logits
    # V2 runner (dense): samples in place
    assert sampler_phase_bytes(spec(), max_num_batched_tokens=t, max_num_seqs=seqs) == common
    # V1 runner (Qwen3-MoE): + float32 logits, softmax and noise, + the 132-row Triton top-k/top-p buffer
    assert sampler_phase_bytes(moe_spec(), max_num_batched_tokens=t, max_num_seqs=seqs) == common + seqs * v * 12 + 132 * v * 4
    # fewer rows than SMs: the buffer has the next power of two of rows
    s = 100
    small = t * h * 2 + s * h * 2 + s * v * 2 + s * v * 12 + 128 * v * 4
    assert sampler_phase_bytes(moe_spec(), max_num_batched_tokens=t, max_num_seqs=s) == small


def test_the_peak_is_the_larger_phase_not_the_sum():
    from servebook.memory import peak_activation_bytes, sampler_phase_bytes

    c = MemoryCoefficients(activation={"constant_bytes": 0.0, "hidden": 1.0, "mlp": 0.0, "moe_workspace": 0.0,
                                       "sampler": 1.0},
                           non_torch_tp1_bytes=0.0, non_torch_tp_gt1_bytes=0.0, cudagraph_constant_bytes=0.0,
                           cudagraph_per_layer_bytes=0.0)
    kw = dict(max_num_seqs=1024, coefficients=c)
    # V1 MoE at 1,024 tokens: the sampler's 1,024 x vocab float32 tensors dwarf one copy of the hidden states
    assert peak_activation_bytes(moe_spec(), max_num_batched_tokens=1024, **kw) == sampler_phase_bytes(
        moe_spec(), max_num_batched_tokens=1024, max_num_seqs=1024)
    # dense (V2) at 64k tokens: one copy of 65,536 x 4096 x 2 bytes beats bf16 logits of 1,024 rows
    t = 65536
    assert sampler_phase_bytes(spec(), max_num_batched_tokens=t, max_num_seqs=1024) > t * 4096 * 2
    assert peak_activation_bytes(spec(), max_num_batched_tokens=t, **kw) == sampler_phase_bytes(
        spec(), max_num_batched_tokens=t, max_num_seqs=1024)
    kw2 = dict(max_num_seqs=8, coefficients=c)
    assert peak_activation_bytes(spec(), max_num_batched_tokens=t, **kw2) == max(
        t * 4096 * 2, sampler_phase_bytes(spec(), max_num_batched_tokens=t, max_num_seqs=8))


def test_weights_that_do_not_fit_name_the_smallest_tp_that_does():
    # 150 GB of weights on an 80 GiB GPU at 0.9: 72 GiB requested.
    # TP=2 leaves 75 GB = 69.8 GiB of weights + 1.1 GiB activation + 1.5 GiB non-torch + 0.3 GiB graphs > 72 GiB;
    # TP=4: 37.5 GB = 34.9 GiB of weights: fits.
    big = spec(layers=32, weight_bytes=150 * 10**9)
    with pytest.raises(DoesNotFitError, match="--tp 4 "):
        memory_budget(big, gpu_memory_bytes=80 * GIB, gpu_memory_utilization=0.9,
                      max_num_batched_tokens=8192, max_num_seqs=256, coefficients=SIMPLE)


def test_a_model_no_tp_can_fit_says_so():
    huge = spec(layers=32, heads=1, kv=1, weight_bytes=10**13)
    with pytest.raises(DoesNotFitError, match="no tensor-parallel size"):
        memory_budget(huge, gpu_memory_bytes=80 * GIB, max_num_batched_tokens=8192, max_num_seqs=256, coefficients=SIMPLE)


@pytest.mark.parametrize("u", [0, -0.1, 1.01, float("nan"), 2])
def test_utilization_out_of_range_names_the_range(u):
    with pytest.raises(ServebookError, match=r"\(0, 1\]"):
        memory_budget(spec(), gpu_memory_bytes=80 * GIB, gpu_memory_utilization=u,
                      max_num_batched_tokens=8192, max_num_seqs=256, coefficients=SIMPLE)


@pytest.mark.parametrize("kw", [{"max_num_batched_tokens": 0}, {"max_num_seqs": -1}, {"gpu_memory_bytes": 0}])
def test_non_positive_inputs_are_refused(kw):
    args = dict(gpu_memory_bytes=80 * GIB, max_num_batched_tokens=8192, max_num_seqs=256)
    args.update(kw)
    with pytest.raises(ServebookError):
        memory_budget(spec(), coefficients=SIMPLE, **args)


@settings(max_examples=80, deadline=None)
@given(
    gib=st.integers(min_value=1, max_value=200),
    u=st.floats(min_value=0.05, max_value=1.0),
    weights_gb=st.integers(min_value=1, max_value=400),
    tokens=st.sampled_from([512, 2048, 8192, 16384]),
)
def test_budget_is_never_negative_and_monotone_in_memory(gib, u, weights_gb, tokens):
    s = spec(weight_bytes=weights_gb * 10**9)
    kw = dict(max_num_batched_tokens=tokens, max_num_seqs=256, gpu_memory_utilization=u, coefficients=SIMPLE)
    try:
        small = memory_budget(s, gpu_memory_bytes=gib * GIB, **kw)
    except DoesNotFitError:
        return
    assert small.available_kv_bytes > 0
    big = memory_budget(s, gpu_memory_bytes=(gib + 10) * GIB, **kw)
    assert big.available_kv_bytes >= small.available_kv_bytes


def test_shipped_coefficients_are_complete_and_say_their_status():
    c = load_coefficients()
    assert c.status in ("prior", "fitted")
    assert set(c.activation) == set(ACTIVATION_FEATURES)
    assert all(v >= 0 for v in c.activation.values())
    if c.status == "fitted":
        assert c.fitted_on and c.vllm_version and c.gpu


def test_coefficients_round_trip_and_malformed_files_are_clear_errors(tmp_path):
    p = write_coefficients(SIMPLE, tmp_path / "c.json")
    assert load_coefficients(p).activation == SIMPLE.activation
    (tmp_path / "bad.json").write_text(json.dumps({"activation": {}}))
    with pytest.raises(ServebookError, match="malformed"):
        load_coefficients(tmp_path / "bad.json")
    (tmp_path / "notjson.json").write_text("{")
    with pytest.raises(ServebookError, match="not JSON"):
        load_coefficients(tmp_path / "notjson.json")


# ---- calibration ----------------------------------------------------------------------------

TRUE = {"constant_bytes": 300 * MIB, "hidden": 3.0, "mlp": 2.5, "moe_workspace": 1.2, "sampler": 0.9}


def hand_peak(s: ModelSpec, t: int, seqs: int, tp: int, truth=TRUE) -> float:
    """The activation model written out independently: copies x bytes of each tensor, larger phase."""
    rows = min(seqs, t)
    hidden = t * s.hidden_size * 2
    dense_mlp = t * 3 * s.intermediate_size / tp * 2 if s.moe is None else 0.0   # gate+up (2I), activated (I)
    v1 = s.moe is not None   # the hand-made MoE specs are Qwen3-MoE: V1 runner, 16-bit experts
    ws = 0.0
    if s.moe is not None:
        i = s.moe.expert_intermediate_size / tp
        ws = t * s.moe.experts_per_token * (max(i, s.hidden_size) + max(2 * i, s.hidden_size)) * 2
    sampler = hidden + rows * s.hidden_size * 2 + rows * s.vocab_size * 2
    if v1:
        sampler += rows * s.vocab_size * (4 + 4 + 4) + min(132, 1 << (min(132, rows) - 1).bit_length()) * s.vocab_size * 4
    phases = [truth["hidden"] * hidden + truth["mlp"] * dense_mlp,
              truth["moe_workspace"] * ws + truth["hidden"] * hidden,
              truth["moe_workspace"] * ws + truth["sampler"] * sampler]
    return truth["constant_bytes"] + max(phases)


def synthetic_records(noise: float = 0.0, seed: int = 0) -> list[CalibrationRecord]:
    rng = random.Random(seed)
    shapes = [
        dict(hidden=4096, inter=14336, heads=32, kv=8, vocab=128256, layers=32),
        dict(hidden=5120, inter=25600, heads=64, kv=8, vocab=151936, layers=64),
        dict(hidden=8192, inter=28672, heads=64, kv=8, vocab=128256, layers=80),
        dict(hidden=2048, inter=6144, heads=16, kv=4, vocab=32000, layers=24),
        dict(hidden=2048, inter=6144, heads=32, kv=4, vocab=151936, layers=48, architecture="Qwen3MoeForCausalLM",
             moe=MoESpec(num_experts=128, experts_per_token=8, expert_intermediate_size=768, num_shared_experts=0,
                         shared_intermediate_size=0, moe_layer_indices=tuple(range(48)), params_per_expert=0)),
    ]
    records = []
    for i, shape in enumerate(shapes):
        s = spec(**shape)
        for t, seqs, tp in [(2048, 256, 1), (8192, 1024, 1), (16384, 1024, 2), (4096, 128, 4), (32768, 1024, 1)]:
            peak = hand_peak(s, t, seqs, tp) * (1 + rng.uniform(-noise, noise))
            records.append(CalibrationRecord(
                name=f"synthetic-{i}-{t}-{tp}", spec=s, max_num_batched_tokens=t, max_num_seqs=seqs, tp=tp,
                peak_activation_bytes=peak,
                non_torch_bytes=(0.25 * GIB if tp == 1 else 1.25 * GIB),
                cudagraph_bytes=64 * MIB + 8 * MIB * shape["layers"],
            ))
    return records


def test_calibrate_recovers_known_coefficients_from_exact_data():
    fitted = calibrate(synthetic_records(), vllm_version="synthetic", gpu="none")
    for k, v in TRUE.items():
        assert fitted.activation[k] == pytest.approx(v, rel=1e-6), k
    assert fitted.non_torch_tp1_bytes == pytest.approx(0.25 * GIB)
    assert fitted.non_torch_tp_gt1_bytes == pytest.approx(1.25 * GIB)
    assert fitted.cudagraph_constant_bytes == pytest.approx(64 * MIB, rel=1e-6)
    assert fitted.cudagraph_per_layer_bytes == pytest.approx(8 * MIB, rel=1e-6)
    assert fitted.status == "fitted" and len(fitted.fitted_on) == 25


def test_calibrate_is_close_under_two_percent_noise_and_predicts_within_five_percent():
    fitted = calibrate(synthetic_records(noise=0.02, seed=1))
    s = spec(hidden=3072, inter=8192, heads=24, kv=8, vocab=100000, layers=28)  # not in the fit
    b = memory_budget(s, gpu_memory_bytes=80 * GIB, max_num_batched_tokens=8192, max_num_seqs=512, coefficients=fitted)
    truth = hand_peak(s, 8192, 512, 1)
    assert b.activation_bytes == pytest.approx(truth, rel=0.05)


def test_calibrate_refuses_too_few_settings():
    with pytest.raises(ServebookError, match="at least 5 distinct"):
        calibrate(synthetic_records()[:2])
    with pytest.raises(ServebookError, match="at least one"):
        calibrate([])


# ---- records from logs ----------------------------------------------------------------------

LOG_026 = (
    "Model loading took 14.99 GiB memory and 6.1 seconds\n"
    "Available KV cache memory: 107.76 GiB\n"
    "CUDA graph pool memory: 0.52 GiB (actual), 0.61 GiB (estimated), difference: 0.09 GiB (17.3%).\n"
    "Free memory on device (139.26/139.8 GiB) on startup. Desired GPU memory utilization is (0.92, 128.62 GiB). "
    "Actual usage is 14.99 GiB for weight, 4.77 GiB for peak activation, 0.48 GiB for non-torch memory, "
    "and 0.52 GiB for CUDAGraph memory. Replace ...\n"
)
LOG_0271 = (
    "Model loading took 14.99 GiB memory and 6.1 seconds\n"
    "Available KV cache memory: 107.76 GiB\n"
    "CUDA graph pool memory: 0.52 GiB (actual), 0.61 GiB (estimated), difference: 0.09 GiB (17.3%).\n"
    "Free memory on device (139.26/139.8 GiB) on startup. Desired GPU memory utilization is (0.92, 128.62 GiB). "
    "Actual usage is 15.47 GiB for consumed memory (weights + non-torch), 5.38 GiB for peak activation, "
    "and 0.52 GiB for CUDAGraph memory. Replace ...\n"
)


def test_record_from_a_0_26_log_takes_the_claims_as_printed():
    r = record_from_log("x", spec(), parse_startup_log(LOG_026), max_num_batched_tokens=8192, max_num_seqs=1024)
    assert r.peak_activation_bytes == pytest.approx(4.77 * GIB)
    assert r.non_torch_bytes == pytest.approx(0.48 * GIB)
    assert r.cudagraph_bytes == pytest.approx(0.61 * GIB)  # the estimate is what the budget subtracts


def test_record_from_a_0_27_1_log_separates_the_graph_estimate_and_non_torch():
    r = record_from_log("x", spec(), parse_startup_log(LOG_0271), max_num_batched_tokens=8192, max_num_seqs=1024)
    assert r.peak_activation_bytes == pytest.approx((5.38 - 0.61) * GIB)
    assert r.non_torch_bytes == pytest.approx((15.47 - 14.99) * GIB)


def test_budget_from_log_reproduces_the_logged_available_memory_within_rounding():
    b = budget_from_log(parse_startup_log(LOG_026))
    # 128.62 - 14.99 - 4.77 - 0.48 - 0.61 = 107.77 GiB vs logged 107.76: each figure is rounded to 0.01.
    rebuilt = b.requested_bytes - b.weights_bytes - b.activation_bytes - b.non_torch_bytes - b.cudagraph_bytes
    assert abs(rebuilt - b.available_kv_bytes) <= 0.03 * GIB


def test_cpu_logs_cannot_calibrate():
    cpu = parse_startup_log("Explicitly set (1.0/11.59) GiB for KV cache on node 0.\nGPU KV cache size: 10 tokens\n")
    with pytest.raises(ServebookError, match="only GPU start-up logs"):
        record_from_log("cpu", spec(), cpu, max_num_batched_tokens=2048, max_num_seqs=128)


# ---- vLLM batch defaults (engine/arg_utils.py, EngineArgs.get_batch_defaults) ---------------

from servebook.memory import peak_activation_bytes, vllm_batch_defaults  # noqa: E402
from servebook.memory_fit import calibrate_from_fixtures, records_from_fixtures  # noqa: E402


@pytest.mark.parametrize(
    "memory, name, context, device, expected",
    [
        (140 * GIB, "H200", "OPENAI_API_SERVER", "cuda", (8192, 1024)),
        (140 * GIB, "H200", "LLM_CLASS", "cuda", (16384, 1024)),
        (80 * GIB, "NVIDIA A100-SXM4-80GB", "OPENAI_API_SERVER", "cuda", (2048, 256)),
        (80 * GIB, "NVIDIA A100-SXM4-80GB", "LLM_CLASS", "cuda", (8192, 256)),
        (48 * GIB, "L40S", "OPENAI_API_SERVER", "cuda", (2048, 256)),
        (None, None, "LLM_CLASS", "cpu", (4096, 256)),
        (None, None, "OPENAI_API_SERVER", "cpu", (2048, 128)),
    ],
)
def test_batch_defaults_follow_the_0_27_1_table(memory, name, context, device, expected):
    assert vllm_batch_defaults(memory, name, usage_context=context, device=device) == expected


def test_batch_default_tokens_are_capped_by_seqs_times_context():
    # 1024 sequences x 4 tokens = 4096 < 8192
    assert vllm_batch_defaults(140 * GIB, "H200", max_model_len=4) == (4096, 1024)


# ---- calibration from fixture folders (the layout the H200 logs will use) -------------------

def _write_gpu_fixture(root, name, model_id, tokens, seqs, truth):
    """A GPU fixture whose 0.26-style log states the claims the 'truth' coefficients give."""
    from servebook.hf_config import load_reference_config, load_model_spec

    folder = root / name
    folder.mkdir()
    cfg = load_reference_config(model_id)
    (folder / "config.json").write_text(json.dumps(cfg))
    s = load_model_spec(cfg)
    peak = hand_peak_for(s, tokens, seqs, truth) / GIB
    flags = {"engine_kwargs": {"max_model_len": 4096, "max_num_batched_tokens": tokens, "max_num_seqs": seqs},
             "device": "NVIDIA H200", "vllm_version": "0.26.0", "usage_context": "LLM_CLASS"}
    (folder / "flags.json").write_text(json.dumps(flags))
    (folder / "startup.log").write_text(
        "Initializing a V1 LLM engine (v0.26.0) with config: model='x'\n"
        "CUDA graph pool memory: 0.50 GiB (actual), 0.60 GiB (estimated), difference: 0.1 GiB (20.0%).\n"
        "Free memory on device (139.26/139.8 GiB) on startup. Desired GPU memory utilization is (0.92, 128.62 GiB). "
        f"Actual usage is 10.00 GiB for weight, {peak:.2f} GiB for peak activation, 0.25 GiB for non-torch memory, "
        "and 0.50 GiB for CUDAGraph memory. Replace ...\n"
    )
    return s


def hand_peak_for(s, t, seqs, truth):
    return hand_peak(s, t, seqs, 1, truth)


def test_calibrate_from_gpu_fixture_folders_reproduces_the_logged_peaks(tmp_path):
    truth = {"constant_bytes": 200 * MIB, "hidden": 4.0, "mlp": 1.0, "moe_workspace": 0.0, "sampler": 1.0}
    cases = [("llama-3.1-8b", 2048, 256), ("llama-3.1-8b", 16384, 1024), ("qwen3-32b", 8192, 512),
             ("qwen3-32b", 4096, 128), ("llama-3.1-70b", 8192, 1024), ("mistral-7b-v0.1", 1024, 1024)]
    specs = [_write_gpu_fixture(tmp_path, f"h200-{i}", m, t, n, truth) for i, (m, t, n) in enumerate(cases)]
    # a CPU folder in the same tree is skipped
    (tmp_path / "cpu-x").mkdir()
    (tmp_path / "cpu-x" / "flags.json").write_text(json.dumps({"device": "cpu", "engine_kwargs": {}}))
    (tmp_path / "cpu-x" / "startup.log").write_text("GPU KV cache size: 1 tokens\n")
    assert [r.name for r in records_from_fixtures(tmp_path)] == [f"h200-{i}" for i in range(6)]

    out = tmp_path / "fitted.json"
    fitted = calibrate_from_fixtures(tmp_path, write_to=out)
    assert fitted.vllm_version == "0.26.0" and fitted.gpu == "NVIDIA H200"
    assert load_coefficients(out).fitted_on == tuple(f"h200-{i}" for i in range(6))
    assert fitted.non_torch_tp1_bytes == pytest.approx(0.25 * GIB)
    assert fitted.cudagraph_constant_bytes + fitted.cudagraph_per_layer_bytes * 32 == pytest.approx(0.6 * GIB, rel=0.01)
    for s, (_, t, n) in zip(specs, cases):
        predicted = peak_activation_bytes(s, max_num_batched_tokens=t, max_num_seqs=n, coefficients=fitted)
        # logged figures carry 0.005 GiB of rounding each
        assert abs(predicted - hand_peak_for(s, t, n, truth)) < 0.02 * GIB
