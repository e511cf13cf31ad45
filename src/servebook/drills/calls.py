"""Thin wrappers that compute every numeric drill's answer from the library.

Each function takes plain JSON-able arguments (model ids, GPU names, token counts),
calls the library module that owns the concept, and returns one number in the unit its
name says. The drills data file (``servebook/data/drills.toml``) names these functions and
their arguments; nothing here re-implements a model.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from servebook.errors import ServebookError
from servebook.memory import DEFAULT_GPU_MEMORY_UTILIZATION
from servebook.records import RESULTS_ENV, checkout_root, results_path
from servebook.shipped import BENCH_DIR, STARTUP_LOGS_DIR
from servebook.vllm_rules import CUDA_DEFAULT_BLOCK_SIZE, LARGE_GPU_BATCH_DEFAULTS

GIB = 2**30

#: Recorded material the debugging drills read (shipped start-ups and capture; recorded step timings).
STARTUP_LOGS = STARTUP_LOGS_DIR
BENCH_CAPTURES = BENCH_DIR
STEP_TIMING = results_path("step_timing")


@lru_cache(maxsize=None)
def _spec(model: str):
    from servebook.hf_config import load_model_spec

    return load_model_spec(model)


@lru_cache(maxsize=None)
def _coeffs(gpu: str):
    from servebook.perf.model import calibrated_coefficients

    return calibrated_coefficients(gpu)[0]


def _gpu(gpu: str):
    from servebook.hardware import get_gpu

    return get_gpu(gpu)


# --------------------------------------------------------------------- memory (6.1, 6.5-6.9)

def weights_gib(model: str, tp: int = 1) -> float:
    """Weight bytes one GPU holds (every expert of an MoE), GiB."""
    from servebook.memory import weights_bytes_per_gpu

    return weights_bytes_per_gpu(_spec(model), tp) / GIB


def lora_slots_gib(model: str, max_loras: int, max_lora_rank: int, tp: int = 1) -> float:
    """GiB of stacked LoRA tensors ``--enable-lora`` reserves on one GPU (servebook.lora)."""
    from servebook.lora import LoraSettings, lora_weights_bytes

    return lora_weights_bytes(_spec(model), LoraSettings(max_loras, max_lora_rank), tp) / GIB


def weight_read_ms(model: str, gpu: str) -> float:
    """Milliseconds to stream every weight once at the GPU's peak HBM bandwidth (batch-1 decode floor)."""
    return _spec(model).weight_bytes / _gpu(gpu).hbm_bandwidth_bytes_per_s * 1e3


def naive_kv_kib_per_token(model: str, kv_cache_dtype: str = "auto") -> float:
    """Textbook KV per token, 2 (K and V) x layers x KV heads x head_dim x bytes, KiB; ignores sliding windows."""
    from servebook.kv_cache import kv_dtype_bytes

    return _spec(model).kv_bytes_per_token(kv_dtype_bytes(kv_cache_dtype)) / 1024


def kv_gib_per_sequence(model: str, context: int, kv_cache_dtype: str = "auto", tp: int = 1,
                        max_num_batched_tokens: int = LARGE_GPU_BATCH_DEFAULTS["OPENAI_API_SERVER"][0]) -> float:
    """KV cache one ``context``-token request reserves on one GPU in vLLM 0.27.1 on CUDA, GiB (the token
    budget defaults to ``vllm serve``'s on an H100 or H200).

    Uses vLLM's grouping, sliding-window reservation (async scheduling on: two steps of
    ``max_num_batched_tokens`` in flight), padding layers and TP sharding.
    """
    from servebook.kv_cache import kv_cache_layout, min_kv_bytes_for_one_request

    layout = kv_cache_layout(_spec(model), kv_cache_dtype=kv_cache_dtype, tp=tp)
    return min_kv_bytes_for_one_request(layout, context, 2 * max_num_batched_tokens) / GIB


def naive_kv_gib_per_sequence(model: str, context: int, kv_cache_dtype: str = "auto") -> float:
    """Textbook KV for one request: naive bytes per token x context, GiB (no windows, no padding)."""
    return naive_kv_kib_per_token(model, kv_cache_dtype) * 1024 * context / GIB


def _plan(model, gpu, max_model_len, tp, kv_cache_dtype, gpu_memory_utilization):
    from servebook.plan import make_plan

    return make_plan(model, gpu=gpu, tp=tp, max_model_len=max_model_len, kv_cache_dtype=kv_cache_dtype,
                     gpu_memory_utilization=gpu_memory_utilization)


def available_kv_gib(model: str, gpu: str, max_model_len: int, tp: int = 1,
                     gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> float:
    """Predicted ``Available KV cache memory`` per GPU for ``vllm serve`` defaults, GiB."""
    return _plan(model, gpu, max_model_len, tp, "auto", gpu_memory_utilization).available_kv_bytes / GIB


def max_concurrency(model: str, gpu: str, max_model_len: int, tp: int = 1, kv_cache_dtype: str = "auto",
                    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> float:
    """Predicted ``Maximum concurrency for max_model_len tokens per request``: the logged admission bound (requests)."""
    return _plan(model, gpu, max_model_len, tp, kv_cache_dtype, gpu_memory_utilization).capacity.max_concurrency


def running_concurrency(model: str, gpu: str, max_model_len: int, tp: int = 1, kv_cache_dtype: str = "auto",
                        gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> float:
    """Full-length requests that run at once (``servebook plan``'s run-time figure), requests.

    Larger than :func:`max_concurrency` for sliding-window models: running requests free the
    blocks that left the window (:func:`servebook.kv_cache.running_concurrency`).
    """
    return _plan(model, gpu, max_model_len, tp, kv_cache_dtype, gpu_memory_utilization).running.max_running


def recommended_max_num_seqs(model: str, gpu: str, max_model_len: int, tp: int = 1,
                             kv_cache_dtype: str = "auto",
                             gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> float:
    """``servebook plan``'s ``--max-num-seqs`` (85% of the run-time concurrency, capped by vLLM's default), sequences."""
    return _plan(model, gpu, max_model_len, tp, kv_cache_dtype, gpu_memory_utilization).recommended_max_num_seqs


def kv_budget_change_gib(model: str, gpu: str, max_model_len: int, utilization_from: float,
                         utilization_to: float, tp: int = 1) -> float:
    """GiB of KV cache per GPU gained by raising ``--gpu-memory-utilization`` (can be negative)."""
    return (available_kv_gib(model, gpu, max_model_len, tp, utilization_to)
            - available_kv_gib(model, gpu, max_model_len, tp, utilization_from))


def default_reserve_gib(gpu: str) -> float:
    """GiB of a GPU outside vLLM 0.27.1's default ``gpu_memory_utilization`` budget."""
    return _gpu(gpu).memory_bytes * (1 - DEFAULT_GPU_MEMORY_UTILIZATION) / GIB


def default_max_num_seqs(gpu: str, usage_context: str = "OPENAI_API_SERVER") -> float:
    """vLLM 0.27.1's default ``--max-num-seqs`` for a GPU (sequences)."""
    from servebook.memory import vllm_batch_defaults

    g = _gpu(gpu)
    return vllm_batch_defaults(g.memory_bytes, g.name, usage_context=usage_context)[1]


def default_max_num_batched_tokens(gpu: str, usage_context: str = "OPENAI_API_SERVER") -> float:
    """vLLM 0.27.1's default ``--max-num-batched-tokens`` for a GPU (tokens)."""
    from servebook.memory import vllm_batch_defaults

    g = _gpu(gpu)
    return vllm_batch_defaults(g.memory_bytes, g.name, usage_context=usage_context)[0]


# --------------------------------------------------------------------- paging and batching (6.2, 6.3, 6.12)

def paged_waste_tokens(tokens: int, block_size: int = CUDA_DEFAULT_BLOCK_SIZE) -> float:
    """Slots allocated but unused in a sequence's last block, tokens (at most ``block_size - 1``)."""
    if tokens < 1 or block_size < 1:
        raise ServebookError("tokens and block_size must be >= 1")
    return -(-tokens // block_size) * block_size - tokens


def contiguous_waste_pct(reserved_tokens: int, used_tokens: int) -> float:
    """Percent of a worst-case contiguous reservation that a request never uses."""
    if not 0 < used_tokens <= reserved_tokens:
        raise ServebookError("need 0 < used_tokens <= reserved_tokens")
    return 100.0 * (reserved_tokens - used_tokens) / reserved_tokens


def static_batch_useful_pct(output_tokens: list[int]) -> float:
    """Percent of decode slots doing useful work when a static batch runs until its longest member ends."""
    if not output_tokens or min(output_tokens) < 1:
        raise ServebookError("give at least one positive output length")
    return 100.0 * sum(output_tokens) / (len(output_tokens) * max(output_tokens))


def requests_that_fit(num_blocks: int, block_size: int, tokens_per_request: int) -> float:
    """Requests whose every block is resident at once: blocks // blocks per request
    (:func:`servebook.kv_cache.requests_that_fit`; requests)."""
    from servebook.kv_cache import requests_that_fit as fit

    return float(fit(int(num_blocks), int(tokens_per_request), int(block_size)))


def prefix_cached_tokens(shared_prefix_tokens: int, block_size: int = CUDA_DEFAULT_BLOCK_SIZE) -> float:
    """Prompt tokens a prefix-cache hit can skip: only full blocks are cached and shared, tokens."""
    return (shared_prefix_tokens // block_size) * block_size


# --------------------------------------------------------------------- performance (6.4, 6.10-6.19)

def decode_step_ms(model: str, gpu: str, batch: int, context: int, tp: int = 1,
                   kv_cache_dtype: str = "auto") -> float:
    """Calibrated decode step time for ``batch`` sequences of mean context ``context``, ms."""
    from servebook.perf.model import decode_step

    return decode_step(_spec(model), gpu, _coeffs(gpu), batch=batch, context_tokens=context, tp=tp,
                       kv_cache_dtype=kv_cache_dtype).step_s * 1e3


def decode_tokens_per_s(model: str, gpu: str, batch: int, context: int, tp: int = 1) -> float:
    """Output tokens per second of one replica decoding ``batch`` sequences (tokens/s)."""
    return batch / (decode_step_ms(model, gpu, batch, context, tp) / 1e3)


def decode_kv_to_weight_bytes(model: str, batch: int, context: int, kv_cache_dtype: str = "auto") -> float:
    """KV bytes read per decode step divided by weight bytes read (>1: the cache dominates)."""
    from servebook.perf.work import decode_work, dense_weight_bytes_read, expert_weight_bytes_read

    spec = _spec(model)
    w = decode_work(spec, batch, context, kv_cache_dtype=kv_cache_dtype)
    weights = dense_weight_bytes_read(spec, 1) + float(expert_weight_bytes_read(spec, w.tokens, 1))
    return w.kv_read_bytes / weights


def prefill_ms(model: str, gpu: str, tokens: int, tp: int = 1) -> float:
    """Calibrated time of one step that prefills ``tokens`` prompt tokens, ms."""
    from servebook.perf.model import prefill_step

    return prefill_step(_spec(model), gpu, _coeffs(gpu), tokens=tokens, tp=tp).step_s * 1e3


def ridge_batch(model: str, gpu: str, context: int) -> float:
    """Smallest decode batch whose arithmetic intensity reaches the GPU's ridge point (sequences)."""
    from servebook.perf.roofline import ridge_batch as _ridge

    b = _ridge(_spec(model), gpu, context)
    if b is None:
        raise ServebookError(f"{model} never reaches the ridge on {gpu} at context {context}")
    return b


def chunk_tokens_within_ms(model: str, gpu: str, target_ms: float, decode_batch: int,
                           decode_context: int) -> float:
    """Largest prefill chunk that keeps a mixed step within ``target_ms`` (tokens)."""
    from servebook.perf.chunk_budget import prefill_tokens_within

    return prefill_tokens_within(_spec(model), gpu, _coeffs(gpu), target_step_s=target_ms / 1e3,
                                 decode_batch=decode_batch, decode_context_tokens=decode_context)


def cudagraph_max_tokens(max_num_seqs: int, max_num_batched_tokens: int, num_speculative_tokens: int = 0) -> float:
    """Largest step vLLM 0.27.1 replays as a CUDA graph by default; larger steps run eagerly (tokens)."""
    from servebook.perf.model import cudagraph_max_tokens as _cg

    return _cg(max_num_seqs, max_num_batched_tokens, num_speculative_tokens=num_speculative_tokens)


def expected_tokens_per_step(k: int, alpha: float) -> float:
    """Tokens per sequence per verification step with ``k`` drafts at per-token acceptance ``alpha``."""
    from servebook.perf.speculative import expected_tokens_per_step as _e

    return _e(k, alpha)


def kth_draft_acceptance_pct(k: int, alpha: float) -> float:
    """Chance that the ``k``-th draft token is accepted (all before it accepted too), percent."""
    if not 0 <= alpha <= 1 or k < 1:
        raise ServebookError("need k >= 1 and 0 <= alpha <= 1")
    return 100.0 * alpha**k


def break_even_acceptance(model: str, gpu: str, k: int, batch: int, context: int,
                          drafter_model: str | None = None, tp: int = 1) -> float:
    """Per-token acceptance below which ``k`` drafts slow decoding down (probability).

    ``drafter_model`` None: n-gram drafting (no GPU cost); else a draft model by reference id.
    """
    from servebook.perf.speculative import Drafter, break_even_acceptance as _be

    drafter = Drafter() if drafter_model is None else Drafter("draft_model", spec=_spec(drafter_model))
    a = _be(_spec(model), gpu, _coeffs(gpu), k=k, batch=batch, context_tokens=context, drafter=drafter, tp=tp)
    if a is None:
        raise ServebookError(f"no acceptance makes k={k} pay off at batch {batch}")
    return a


def decode_speed_ratio(model_a: str, model_b: str, gpu: str, batch: int, context: int) -> float:
    """Decode step of ``model_b`` divided by that of ``model_a`` at the same batch and context (ratio)."""
    return decode_step_ms(model_b, gpu, batch, context) / decode_step_ms(model_a, gpu, batch, context)


def total_params_b(model: str) -> float:
    """Every stored parameter (all experts, embedding and head), billions."""
    return _spec(model).params.total / 1e9


def active_params_b(model: str) -> float:
    """Active parameters per token (top-k experts plus every shared weight, the embedding included), billions.

    The same count the chapter quotes (``ModelSpec.params.active``) and Qwen and Mistral publish;
    compute models subtract the embedding lookup (:func:`servebook.hf_config.active_matmul_params`).
    """
    return _spec(model).params.active / 1e9


def kv_heads_per_gpu(model: str, tp: int, layer: int = -1) -> float:
    """KV heads one GPU stores for a layer at tensor-parallel size ``tp`` (replicated when tp > heads)."""
    from servebook.kv_cache import layer_cache_specs

    specs = layer_cache_specs(_spec(model), tp=tp)
    return specs[layer].kv_heads


# --------------------------------------------------------------------- fleets (6.20-6.22)

def fleet_hours(model: str, gpu: str, gpus: int, requests: int, input_tokens: int, output_tokens: int,
                tp: int = 1, kv_cache_dtype: str = "auto", k: int = 0, alpha: float = 0.0) -> float:
    """Wall-clock hours for a fleet to finish a batch job (n-gram speculation when ``k`` > 0)."""
    from servebook.perf.fleet import Deployment, LengthDistribution, Speculation, Workload, plan

    wl = Workload(requests, LengthDistribution.fixed(input_tokens), LengthDistribution.fixed(output_tokens))
    d = Deployment.of(_spec(model), gpu=gpu, gpus=gpus, name="drill", tp=tp, kv_cache_dtype=kv_cache_dtype,
                      speculation=Speculation(k, alpha) if k else None)
    return plan(wl, d, _coeffs(gpu)).hours


def gpus_for_deadline(model: str, gpu: str, hours: float, requests: int, input_tokens: int,
                      output_tokens: int, tp: int = 1) -> float:
    """Fewest GPUs (whole replicas of ``tp``) that finish the job within ``hours`` (GPUs)."""
    replicas = 1
    while replicas <= 4096:
        if fleet_hours(model, gpu, replicas * tp, requests, input_tokens, output_tokens, tp=tp) <= hours:
            return replicas * tp
        replicas = replicas * 2 if replicas < 8 else replicas + max(1, replicas // 8)
    raise ServebookError(f"no fleet up to 4096 replicas finishes in {hours} h")


# --------------------------------------------------------------------- recorded material (debugging)

def _fixture_dir(name: str) -> Path:
    p = STARTUP_LOGS / name
    if not (p / "startup.log").exists():
        raise ServebookError(f"no recorded start-up log {name!r} under {STARTUP_LOGS}")
    return p


def startup_log_text(name: str) -> str:
    """The recorded start-up log of fixture ``name`` (unedited)."""
    return (_fixture_dir(name) / "startup.log").read_text(errors="replace")


def logged(name: str, field: str) -> float:
    """One figure the start-up log prints, as parsed by :func:`servebook.startup_log.parse_startup_log`."""
    from servebook.startup_log import parse_startup_log

    value = getattr(parse_startup_log(startup_log_text(name)), field)
    if value is None:
        raise ServebookError(f"start-up log {name!r} does not print {field}")
    return float(value)


def log_kv_residual_gib(name: str) -> float:
    """Requested memory minus weights, peak activation, non-torch memory and CUDA graphs, GiB.

    The 0.26.0 ``Free memory on device ... Actual usage is ...`` line's own figures.
    """
    from servebook.startup_log import parse_startup_log

    log = parse_startup_log(startup_log_text(name))
    parts = (log.requested_memory_gib, log.weights_gib, log.peak_activation_gib, log.non_torch_gib)
    if any(p is None for p in parts):
        raise ServebookError(f"start-up log {name!r} lacks the memory decomposition line")
    return parts[0] - parts[1] - parts[2] - parts[3] - (log.cudagraph_gib or 0.0)


def predicted_kv_cache_tokens(name: str) -> float:
    """``GPU KV cache size`` predicted from the fixture's config.json, flags and logged KV budget (tokens)."""
    from servebook.hf_config import load_model_spec
    from servebook.kv_cache import capacity
    from servebook.memory import vllm_batch_defaults

    d = _fixture_dir(name)
    flags = json.loads((d / "flags.json").read_text())
    kw = flags["engine_kwargs"]
    spec = load_model_spec(d / "config.json")
    device = "cpu" if flags["device"] == "cpu" else "cuda"
    mml = kw.get("max_model_len") or spec.max_position_embeddings
    tokens = kw.get("max_num_batched_tokens") or vllm_batch_defaults(
        flags.get("gpu_total_memory_bytes"), flags["device"], usage_context=flags["usage_context"],
        max_model_len=mml, device=device)[0]
    cap = capacity(spec, int(logged(name, "available_kv_cache_gib") * GIB), max_model_len=mml,
                   max_num_batched_tokens=tokens, block_size=kw.get("block_size"),
                   kv_cache_dtype=kw.get("kv_cache_dtype", "auto"), tp=kw.get("tensor_parallel_size", 1),
                   device=device, async_scheduling=kw.get("async_scheduling"),
                   vllm_version=flags.get("vllm_version"))
    return cap.kv_cache_tokens


def predicted_padding_layers(name: str) -> float:
    """Padding layers vLLM adds for the fixture's model, from its config.json alone (layers)."""
    from servebook.hf_config import load_model_spec
    from servebook.kv_cache import kv_cache_layout

    d = _fixture_dir(name)
    flags = json.loads((d / "flags.json").read_text())
    kw = flags["engine_kwargs"]
    device = "cpu" if flags["device"] == "cpu" else "cuda"
    return kv_cache_layout(load_model_spec(d / "config.json"), block_size=kw.get("block_size"),
                           kv_cache_dtype=kw.get("kv_cache_dtype", "auto"),
                           tp=kw.get("tensor_parallel_size", 1), device=device,
                           vllm_version=flags.get("vllm_version")).padding_layers


def _step_timing(model_file: str) -> dict:
    path = STEP_TIMING / f"{model_file}.json"
    if not path.exists():
        raise ServebookError(f"no recorded step timing {path}; run inside the book's checkout or set "
                             f"{RESULTS_ENV} to its labs/results folder")
    return json.loads(path.read_text())


def measured_decode_step_ms(model_file: str, batch: int, prompt_tokens: int) -> float:
    """Recorded H200 decode step (labs/results/step_timing), ms."""
    for case in _step_timing(model_file)["cases"]:
        for row in case["result"]["decode"]:
            if row["batch"] == batch and row["prompt_tokens"] == prompt_tokens:
                return row["step_s"] * 1e3
    raise ServebookError(f"{model_file}: no decode point at batch {batch}, prompt {prompt_tokens}")


def measured_prefill_ms(model_file: str, tokens: int) -> float:
    """Recorded H200 prefill of one prompt (labs/results/step_timing), ms."""
    for case in _step_timing(model_file)["cases"]:
        for row in case["result"]["prefill"]:
            if row["tokens"] == tokens:
                return row["time_s"] * 1e3
    raise ServebookError(f"{model_file}: no prefill point at {tokens} tokens")


def measured_bandwidth_pct(model_file: str, batch: int, prompt_tokens: int, gpu: str = "H200") -> float:
    """Weight bytes / recorded decode step / peak HBM bandwidth, percent (weights only: a lower bound)."""
    spec = _spec(_step_timing(model_file)["cases"][0]["model_id"])  # the recorded architecture
    step_s = measured_decode_step_ms(model_file, batch, prompt_tokens) / 1e3
    return 100.0 * spec.weight_bytes / step_s / _gpu(gpu).hbm_bandwidth_bytes_per_s


def measured_batching_gain(model_file: str, batch: int, prompt_tokens: int) -> float:
    """Output tokens/s at ``batch`` divided by tokens/s at batch 1, from recorded steps (ratio)."""
    one = measured_decode_step_ms(model_file, 1, prompt_tokens)
    many = measured_decode_step_ms(model_file, batch, prompt_tokens)
    return batch * one / many


def _capture(capture: str) -> Path:
    p = BENCH_CAPTURES / capture
    if not p.is_dir():
        raise ServebookError(f"no recorded capture {capture!r} under {BENCH_CAPTURES}")
    return p


def capture_text(capture: str, file: str) -> str:
    """One file of a recorded bench/metrics capture (unedited)."""
    return (_capture(capture) / file).read_text(errors="replace")


def metrics_value(capture: str, name: str, file: str = "metrics_after.txt") -> float:
    """A /metrics value from a recorded snapshot (summed over labels; ``_total`` optional)."""
    from servebook.lab.harness.metrics import metric, parse_metrics

    values = parse_metrics(capture_text(capture, file))
    if not any(k in values for k in (name, f"{name}_total", name.removesuffix("_total"))):
        raise ServebookError(f"{capture}/{file} has no metric {name}")
    return metric(values, name)


def metrics_mean(capture: str, histogram: str, file: str = "metrics_after.txt") -> float:
    """Mean of a /metrics histogram (``_sum / _count``) from a recorded snapshot."""
    s = metrics_value(capture, f"{histogram}_sum", file)
    c = metrics_value(capture, f"{histogram}_count", file)
    if c == 0:
        raise ServebookError(f"{histogram} has no observations in {capture}/{file}")
    return s / c


def bench_value(capture: str, key: str) -> float:
    """A figure from the recorded ``vllm bench serve`` result JSON (as vLLM saved it)."""
    data = json.loads(capture_text(capture, "bench_result.json"))
    if key not in data:
        raise ServebookError(f"{capture}/bench_result.json has no {key!r}")
    return float(data[key])


def bench_ratio(capture: str, numerator: str, denominator: str) -> float:
    """Ratio of two figures of a recorded bench result (e.g. p99 over median ITL)."""
    return bench_value(capture, numerator) / bench_value(capture, denominator)


def bench_output_tokens_per_request(capture: str) -> float:
    """Output throughput / request throughput from a recorded bench result (tokens per request)."""
    return bench_value(capture, "output_throughput") / bench_value(capture, "request_throughput")


def log_cudagraph_underestimate_gib(name: str) -> float:
    """CUDA-graph pool memory actually taken minus the estimate subtracted before KV sizing, GiB (log figures)."""
    actual = logged(name, "cudagraph_actual_gib")
    estimated = logged(name, "cudagraph_estimated_gib")
    return actual - estimated


# --------------------------------------------------------------------- online sizing for an SLO (design)

@lru_cache(maxsize=None)
def _slo_sizing(model: str, gpus: tuple, prices: tuple, tps: tuple, rate: float, input_tokens: int,
                output_tokens: int, p99_ttft_s: float, p99_tpot_ms: float, budget_per_hour: float):
    from servebook.simulator.sizing import SLO, size_for_slo

    if len(gpus) != len(prices):
        raise ServebookError(f"give one price per GPU: {len(gpus)} GPUs, {len(prices)} prices")
    return size_for_slo(model, dict(zip(gpus, prices)), list(tps), rate_per_s=rate, input_tokens=input_tokens,
                        output_tokens=output_tokens, slo=SLO(p99_ttft_s, p99_tpot_ms / 1e3),
                        budget_per_hour=budget_per_hour)


def _slo_best(model, gpus, prices, tps, rate, input_tokens, output_tokens, p99_ttft_s, p99_tpot_ms,
              budget_per_hour=float("inf")):
    best, options = _slo_sizing(model, tuple(gpus), tuple(prices), tuple(tps), float(rate), int(input_tokens),
                                int(output_tokens), float(p99_ttft_s), float(p99_tpot_ms), float(budget_per_hour))
    if best is None:
        why = "; ".join(f"{o.gpu} TP {o.tp}: {o.reason}" for o in options)
        raise ServebookError(f"no deployment of {model} meets the SLO within the budget ({why})")
    return best


def slo_cost_per_hour(**kw) -> float:
    """Cost per hour (price units) of the cheapest (GPU, TP, replicas) meeting the SLO within budget."""
    return _slo_best(**kw).cost_per_hour


def slo_replicas(**kw) -> float:
    """Replicas of that cheapest deployment (replicas)."""
    return float(_slo_best(**kw).replicas)


def slo_tp(**kw) -> float:
    """Tensor-parallel size of that cheapest deployment (GPUs per replica)."""
    return float(_slo_best(**kw).tp)


def slo_p99_tpot_ms(**kw) -> float:
    """Simulated p99 TPOT of one replica of that deployment at its share of the load, ms."""
    return _slo_best(**kw).latency.p99_tpot_s * 1e3


def slo_p99_ttft_s(**kw) -> float:
    """Simulated p99 TTFT of one replica of that deployment at its share of the load, s."""
    return _slo_best(**kw).latency.p99_ttft_s


def slo_gpu_price_index(**kw) -> float:
    """Position (0-based) in ``gpus`` of the GPU that deployment uses."""
    return float(list(kw["gpus"]).index(_slo_best(**kw).gpu))


# --------------------------------------------------------------------- recorded lab results (labs/results/labs)

def _lab_measurements(lab: str) -> tuple[str, dict]:
    """(file path as the repository names it, ``measurements``) of a recorded lab result, read and
    checked by :func:`servebook.lab.analyses.rendered.load_lab` (a lab recorded in part files comes merged);
    ``lab`` is the file stem (``l3_preemption_gpu``)."""
    from servebook.lab.analyses.rendered import load_lab

    name, doc = load_lab(lab)
    return repo_relative(Path(name)), doc["measurements"]


def repo_relative(path: Path) -> str:
    """``path`` relative to the repository root when it lies inside it (as error messages name files)."""
    try:
        return str(Path(path).resolve().relative_to(checkout_root()))
    except ValueError:
        return str(path)


def value_at(value, field: str, file: str, container: str, error: type[ServebookError] = ServebookError):
    """The value at dotted path ``field`` (``bench.summary.output_throughput``) inside nested dicts.

    ``file`` and ``container`` (the dotted path of ``value`` inside the file, e.g.
    ``measurements`` or ``measurements.points[2]``) name where to look in the ``error`` raised
    when a key is missing: it gives the full dotted field, the part that is absent and the
    fields that part's parent does have.
    """
    at = container
    for key in field.split("."):
        if not isinstance(value, dict):
            raise error(f"{file} has no field {container}.{field}: {at} is {json.dumps(value)[:40]}, "
                        "not an object with fields")
        if key not in value:
            have = ", ".join(sorted(value)) or "no fields"
            raise error(f"{file} has no field {container}.{field}: {at} has no {key!r}; its fields are {have}")
        value, at = value[key], f"{at}.{key}"
    return value


def lab_point_value(lab: str, match_key: str, match, field: str) -> float:
    """A number of one measurement point of a recorded lab result (``field`` is a dotted path).

    ``lab`` is the file stem (``l3_preemption_gpu``); the point is the one whose
    ``match_key`` equals ``match`` (e.g. ``max_num_seqs`` = 128).
    """
    name, measurements = _lab_measurements(lab)
    points = [pt for pt in measurements["points"] if pt.get(match_key) == match]
    if len(points) != 1:
        raise ServebookError(f"{name}: {len(points)} points have {match_key} = {match!r}; expected one")
    index = measurements["points"].index(points[0])
    return float(value_at(points[0], field, name, f"measurements.points[{index}]"))


def lab_value(lab: str, field: str) -> float:
    """A number of a recorded lab result's ``measurements`` (dotted path, e.g. ``workload.input_len``)."""
    name, measurements = _lab_measurements(lab)
    return float(value_at(measurements, field, name, "measurements"))


def lab_requests_that_fit(lab: str) -> float:
    """Requests of a lab's workload (prompt + output tokens) whose blocks all fit its KV pool at once."""
    return requests_that_fit(int(lab_value(lab, "workload.num_gpu_blocks_override")),
                             int(lab_value(lab, "block_size")), int(lab_tokens_per_request(lab)))


def lab_tokens_per_request(lab: str) -> float:
    """Prompt + output tokens of one request of a lab's workload (tokens)."""
    return lab_value(lab, "workload.input_len") + lab_value(lab, "workload.output_len")
