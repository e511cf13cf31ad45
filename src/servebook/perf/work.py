"""What one engine step moves and computes: bytes read from HBM and FLOPs, per GPU.

This is the physics half of the step-time model: counts derived from a
:class:`~servebook.model_spec.ModelSpec` and the shape of a step, with no
efficiency factors. :mod:`servebook.perf.model` turns the counts into seconds
with coefficients calibrated from measurements.

Conventions (all per GPU of a tensor-parallel group of ``tp`` GPUs):

* Weights are sharded ``1/tp``. A step reads every non-expert weight once,
  whatever the batch, except the input embedding (a row gather) unless it is
  tied to the LM head.
* MoE: a step with ``T`` tokens reads only the experts the batch touches. With
  uniform routing of top-``k`` out of ``E`` experts, the expected number of
  distinct experts per MoE layer is ``E * (1 - (1 - k/E)**T)``.
* Linear-layer FLOPs are ``2 x (active params - embedding - LM head)`` per token,
  plus ``2 x vocab x hidden`` for every token whose logits are computed (every
  decode token; only the last token of a prefill).
* Attention FLOPs per query token and layer are ``2 x q_heads x (d_k + d_v) x keys``,
  keys being the context it attends (capped at the window on sliding layers;
  causal inside a prefill chunk).
* KV bytes read per decode sequence and layer are ``context x kv elements x dtype
  bytes`` (capped at the window on sliding layers); KV heads are sharded across TP
  ranks when ``tp <= kv_heads`` and replicated (one head per rank) beyond; an MLA
  latent is replicated on every rank.
* Tensor parallelism adds two all-reduces per layer of ``tokens x hidden x 2`` bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from servebook.errors import ServebookError
from servebook.model_spec import AttentionLayer, ModelSpec
from servebook.perf._arith import clip, maximum, where
from servebook.reductions import as_floats, dot, is_number, pairwise_sum, require_numpy
from servebook.vllm_rules.cache import kv_dtype_bytes as _kv_dtype_bytes
from servebook.vllm_rules.scheduler import decode_unsettled_tokens
from servebook.vllm_rules.parallel import check_tp, kv_heads_per_gpu  # noqa: F401 (check_tp re-exported)

#: Bytes per activation element moved by a TP all-reduce (bf16 activations).
ACTIVATION_BYTES = 2


def kv_dtype_bytes(kv_cache_dtype: str | int) -> int:
    """Bytes per KV element for a vLLM ``kv_cache_dtype`` name (any case) or a byte count (1, 2 or 4).

    Names follow :data:`servebook.vllm_rules.cache.KV_DTYPE_BYTES`.
    """
    if isinstance(kv_cache_dtype, int):
        if kv_cache_dtype not in (1, 2, 4):
            raise ServebookError(f"KV element size {kv_cache_dtype} bytes is not 1, 2 or 4")
        return kv_cache_dtype
    return _kv_dtype_bytes(str(kv_cache_dtype).lower())


def check_sequence_length(spec: ModelSpec, tokens: float, what: str, fix: str) -> None:
    """Raise a ServebookError when a sequence of ``tokens`` positions exceeds the model's context.

    vLLM's default ``--max-model-len`` is the model's ``max_position_embeddings``, and it
    refuses a prompt (or stops a sequence) beyond it. ``what`` names the sequence and
    ``fix`` says which option to change.
    """
    if tokens > spec.max_position_embeddings:
        raise ServebookError(f"{what} is {tokens:,.0f} tokens, more than {spec.name}'s "
                             f"{spec.max_position_embeddings:,} max_position_embeddings; {fix}")


def kv_elements_per_token_per_gpu(layer: AttentionLayer, tp: int) -> float:
    """KV elements per token one TP rank stores/reads for ``layer``.

    vLLM caches a V slot even where a model shares K and V (Gemma 4's global layers:
    ``v_head_dim`` 0 means "same as K"), and the attention kernel reads both slots, so
    this matches :mod:`servebook.kv_cache`'s page sizes.
    """
    if layer.kind == "mla":
        return float(layer.head_dim)
    return float(kv_heads_per_gpu(layer, tp)) * (layer.head_dim + (layer.v_head_dim or layer.head_dim))


def _attention_dims(spec: ModelSpec, layer: AttentionLayer) -> int:
    """``d_k + d_v`` of one query head (K=V sharing reuses the K width for V)."""
    if layer.kind == "mla":
        return 2 * layer.head_dim
    return layer.head_dim + (layer.v_head_dim or layer.head_dim)


def causal_keys(prior_tokens, new_tokens, window: int | None):
    """Keys attended in total by ``new_tokens`` queries appended after ``prior_tokens``.

    Query ``i`` (1-based position ``prior + i``) attends ``min(prior + i, window)``
    keys. Closed form: two numbers give a float (no numpy needed); arrays or lists give a
    numpy array (numpy needed).
    """
    if is_number(prior_tokens) and is_number(new_tokens):
        return _causal_keys(float(prior_tokens), float(new_tokens), window)
    np = require_numpy("causal_keys over arrays")
    return _causal_keys(np.asarray(prior_tokens, dtype=float), np.asarray(new_tokens, dtype=float), window)


def _float_or_array(tokens, what: str):
    """A number as a float; a sequence or array as a float numpy array (numpy needed for those)."""
    if is_number(tokens):
        return float(tokens)
    return require_numpy(what).asarray(tokens, dtype=float)


def _causal_keys(p, n, window: int | None):
    """:func:`causal_keys` on floats or float arrays ``p`` (prior) and ``n`` (new tokens)."""
    full = n * p + n * (n + 1) / 2
    if window is None:
        return full
    w = float(window)
    # positions p+1 .. p+n; those <= w contribute their position, the rest w.
    k = clip(w - p, 0, n)  # number of queries whose position is <= w
    below = k * p + k * (k + 1) / 2
    return below + (n - k) * w


def _head_params(spec: ModelSpec) -> int:
    return spec.vocab_size * spec.hidden_size


def _bytes_per_param(spec: ModelSpec) -> float:
    return spec.weight_bytes / max(spec.params.total + spec.params.engine_only, 1)


def matmul_params_per_token(spec: ModelSpec) -> int:
    """Parameters in linear layers one token runs through, excluding embedding and LM head
    (the engine's own, ``params.engine_only``, included: it multiplies by them too)."""
    head_and_embedding = spec.params.embedding + (spec.params.lm_head or 0)
    return spec.params.active + spec.params.engine_only - head_and_embedding


def expert_flops_per_token(spec: ModelSpec) -> float:
    """Routed-expert FLOPs per token (2 x top-k x params per expert x MoE layers), 0 for dense models."""
    if spec.moe is None:
        return 0.0
    return 2.0 * spec.moe.experts_per_token * spec.moe.params_per_expert * len(spec.moe.moe_layer_indices)


def tokens_per_touched_expert(spec: ModelSpec, tokens):
    """Rows each touched expert's GEMM gets in a step of ``tokens`` tokens (``tokens x k / distinct``).

    A float for a number of tokens, a numpy array for an array of them."""
    return _tokens_per_touched_expert(spec, _float_or_array(tokens, "tokens_per_touched_expert over arrays"))


def _tokens_per_touched_expert(spec: ModelSpec, t):
    """:func:`tokens_per_touched_expert` of a float or float array ``t`` (a float for a float)."""
    if spec.moe is None:
        return t
    distinct = _expected_distinct_experts(spec, t)
    return where(distinct > 0, t * spec.moe.experts_per_token / maximum(distinct, 1e-12), 0.0)


def expected_distinct_experts(spec: ModelSpec, tokens):
    """Expected distinct routed experts per MoE layer touched by ``tokens`` tokens (uniform routing).

    A float for a number of tokens, a numpy array for an array of them."""
    return _expected_distinct_experts(spec, _float_or_array(tokens, "expected_distinct_experts over arrays"))


def _expected_distinct_experts(spec: ModelSpec, t):
    """:func:`expected_distinct_experts` of a float or float array ``t`` (a float for a float)."""
    if spec.moe is None:
        return 0.0 * t
    return uniform_distinct_experts(spec.moe.num_experts, spec.moe.experts_per_token, t)


def uniform_distinct_experts(num_experts: int, top_k: int, tokens):
    """Expected distinct experts of ``num_experts`` that ``tokens`` tokens touch when each picks ``top_k``
    uniformly at random: ``E x (1 - (1 - k/E)^T)``. Floats or arrays (the type of ``tokens``)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def _expert_bytes_per_param(spec: ModelSpec) -> float:
    """Bytes per routed-expert weight (the model's average where the spec does not say)."""
    bpp = spec.moe.bytes_per_param if spec.moe is not None else None
    return bpp if bpp is not None else _bytes_per_param(spec)


#: Bytes per embedding weight: 16-bit in every format :mod:`servebook.hf_config` models.
EMBEDDING_BYTES_PER_PARAM = 2.0
#: Bytes per weight of the 16-bit experts the expert GEMM's row efficiency was fitted on.
FITTED_EXPERT_BYTES_PER_PARAM = 2.0


def expert_gemm_rows(spec: ModelSpec, tokens):
    """Rows per touched expert as arithmetic intensity sees them: ``tokens_per_touched_expert`` scaled
    by ``2 / bytes per expert weight``.

    A GEMM of few rows is bound by streaming its weights; the rows it takes to become compute-bound
    grow with the bytes per weight. The row-efficiency curve (``matmul_half_tokens``) was fitted on
    16-bit experts, so for 4-bit MXFP4 experts (17/32 byte) one row counts as ~3.8 rows. A float for a
    number of tokens, a numpy array for an array of them."""
    return _expert_gemm_rows(spec, _float_or_array(tokens, "expert_gemm_rows over arrays"))


def _expert_gemm_rows(spec: ModelSpec, t):
    if spec.moe is None:
        return t
    return _tokens_per_touched_expert(spec, t) * (FITTED_EXPERT_BYTES_PER_PARAM / _expert_bytes_per_param(spec))


def expert_gemm_size(spec: ModelSpec, tp: int = 1) -> float:
    """Inner size of a routed expert's GEMMs on one GPU: its FFN width over ``tp`` (elements), 0 for
    dense models. vLLM shards every expert's intermediate dimension across the TP group, and a fused
    MoE kernel's efficiency grows with it (more tiles per expert, a longer inner loop)."""
    if spec.moe is None:
        return 0.0
    return spec.moe.expert_intermediate_size / tp


def dense_weight_bytes_read(spec: ModelSpec, tp: int = 1) -> float:
    """Non-expert weight bytes one GPU reads per step (embedding gather excluded unless tied)."""
    expert_bytes = spec.params.experts * _expert_bytes_per_param(spec)
    # the embedding table stays 16-bit in every checkpoint format modelled (hf_config._weight_bytes)
    embedding_bytes = 0.0 if spec.tie_word_embeddings else spec.params.embedding * EMBEDDING_BYTES_PER_PARAM
    return (spec.weight_bytes - expert_bytes - embedding_bytes) / tp


def expert_weight_bytes_read(spec: ModelSpec, tokens, tp: int = 1):
    """Routed-expert weight bytes one GPU reads in a step of ``tokens`` tokens.

    A float for a number of tokens, a numpy array for an array of them."""
    return _expert_weight_bytes_read(spec, _float_or_array(tokens, "expert_weight_bytes_read over arrays"), tp)


def _expert_weight_bytes_read(spec: ModelSpec, t, tp: int):
    """:func:`expert_weight_bytes_read` of a float or float array ``t`` (a float for a float)."""
    if spec.moe is None:
        return 0.0 * t
    per_expert = spec.moe.params_per_expert * _expert_bytes_per_param(spec)
    layers = len(spec.moe.moe_layer_indices)
    return _expected_distinct_experts(spec, t) * per_expert * layers / tp


@dataclass(frozen=True)
class Work:
    """Additive content of a step, per GPU (weights are added once per step by the model).

    Attributes:
        tokens: tokens scheduled (prefill tokens + decode query tokens).
        sequences: sequences in the step.
        sampled_tokens: tokens whose logits are computed.
        linear_flops: FLOPs in linear layers including the LM head for sampled tokens.
        attention_flops: FLOPs of QK^T and PV.
        kv_read_bytes: KV-cache bytes read by attention.
        expert_flops: the part of ``linear_flops`` spent in routed experts.
        kv_read_bytes_sliding: the part of ``kv_read_bytes`` read by sliding-window layers.
    """

    tokens: float = 0.0
    sequences: float = 0.0
    sampled_tokens: float = 0.0
    linear_flops: float = 0.0
    attention_flops: float = 0.0
    kv_read_bytes: float = 0.0
    expert_flops: float = 0.0
    kv_read_bytes_sliding: float = 0.0

    def __add__(self, other: "Work") -> "Work":
        return Work(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def scaled(self, factor: float) -> "Work":
        return Work(*(a * factor for a in self.astuple()))

    def astuple(self) -> tuple[float, ...]:
        return (self.tokens, self.sequences, self.sampled_tokens, self.linear_flops,
                self.attention_flops, self.kv_read_bytes, self.expert_flops, self.kv_read_bytes_sliding)


#: :meth:`Work.astuple` of a step with nothing in it (as many zeros as Work has fields).
NO_WORK = Work().astuple()


def decode_work(spec: ModelSpec, batch: float, context_tokens, *, tp: int = 1,
                kv_cache_dtype: str | int = "auto", query_tokens: int = 1,
                context_weights=None) -> Work:
    """Work of ``batch`` decoding sequences, per GPU.

    Args:
        batch: running sequences.
        context_tokens: context of a sequence (tokens already in its KV cache); an
            array with ``context_weights`` describes a distribution (the mean of the
            per-sequence work is used, so sliding windows are capped per sequence).
        query_tokens: new tokens per sequence this step (1 + drafts when verifying
            speculative tokens).

    Numbers, lists or numpy arrays; computed in Python floats (no numpy needed). The
    weighted mean context of each window is :func:`servebook.reductions.dot` (correctly
    rounded), so a distribution gives the same result on every machine.
    """
    ctx = as_floats(context_tokens)
    if any(c < 0 for c in ctx):
        raise ServebookError("context must be >= 0 tokens")
    if context_weights is None:
        w = [1.0] * len(ctx)
    else:
        w = as_floats(context_weights)
        if len(w) != len(ctx):
            raise ServebookError(f"{len(w)} context weights for {len(ctx)} contexts; give one weight per context")
    if len(w) == 1:
        w = [w[0] / w[0]]
    else:
        total = pairwise_sum(w)
        w = [x / total for x in w]
    dtype_bytes = kv_dtype_bytes(kv_cache_dtype)
    kv_bytes = 0.0
    kv_sliding = 0.0
    attn_flops = 0.0
    mean_keys_by_window: dict = {}
    for layer in spec.layers:
        window = layer.sliding_window
        mean_keys = mean_keys_by_window.get(window)
        if mean_keys is None:
            keys = ctx if window is None else [c if c <= window else float(window) for c in ctx]
            mean_keys = mean_keys_by_window[window] = w[0] * keys[0] if len(ctx) == 1 else dot(w, keys)
        layer_bytes = mean_keys * kv_elements_per_token_per_gpu(layer, tp) * dtype_bytes
        kv_bytes += layer_bytes
        if window is not None:
            kv_sliding += layer_bytes
        q_heads = spec.num_attention_heads / tp
        # each of the q query tokens attends (about) the whole context
        attn_flops += 2 * q_heads * _attention_dims(spec, layer) * (mean_keys + (query_tokens + 1) / 2) * query_tokens
    tokens = batch * query_tokens
    linear = 2.0 * (matmul_params_per_token(spec) * tokens + _head_params(spec) * tokens) / tp
    return Work(tokens=tokens, sequences=batch, sampled_tokens=tokens, linear_flops=linear,
                attention_flops=attn_flops * batch, kv_read_bytes=kv_bytes * batch,
                expert_flops=expert_flops_per_token(spec) * tokens / tp, kv_read_bytes_sliding=kv_sliding * batch)


def prefill_work(spec: ModelSpec, tokens, *, prior_tokens=0, tp: int = 1,
                 kv_cache_dtype: str | int = "auto", last_chunk: bool = True) -> Work:
    """Work of one prefill chunk of ``tokens`` tokens after ``prior_tokens`` cached ones, per GPU.

    The chunk attends causally to itself and to the prior tokens (window-capped on
    sliding layers); its logits are computed for its last token only when it is
    the prompt's last chunk.
    """
    return Work(*PrefillWork(spec, tp=tp, kv_cache_dtype=kv_cache_dtype)(tokens, prior_tokens, last_chunk))


class PrefillWork:
    """:func:`prefill_work` for one model, TP size and KV dtype, its per-layer constants computed once.

    ``PrefillWork(spec, tp=..., kv_cache_dtype=...)(tokens, prior_tokens, last_chunk)`` is the
    :meth:`Work.astuple` of ``prefill_work(spec, tokens, prior_tokens=..., ...)``: the function
    builds one of these per call, a simulator keeps one for all its steps.
    """

    def __init__(self, spec: ModelSpec, *, tp: int = 1, kv_cache_dtype: str | int = "auto"):
        self.dtype_bytes = kv_dtype_bytes(kv_cache_dtype)
        self.tp = tp
        q_heads = spec.num_attention_heads / tp
        # per layer: window, attention FLOPs per key attended, KV elements per token
        self.layers = tuple((layer.sliding_window, 2 * q_heads * _attention_dims(spec, layer),
                             kv_elements_per_token_per_gpu(layer, tp)) for layer in spec.layers)
        self.matmul_params = matmul_params_per_token(spec)
        self.head_params = _head_params(spec)
        self.expert_flops_per_token = expert_flops_per_token(spec)
        self.groups = _integer_layer_groups(self.layers, self.dtype_bytes)

    def __call__(self, tokens, prior_tokens=0, last_chunk: bool = True) -> tuple[float, ...]:
        n = float(tokens)
        p = float(prior_tokens)
        if n < 1 or p < 0:
            raise ServebookError(f"a prefill chunk needs >= 1 token and >= 0 prior tokens, got {tokens}, {prior_tokens}")
        if self.groups and n.is_integer() and p.is_integer():
            summed = _attention_and_kv_in_integers(self.groups, int(n), int(p))
            if summed is not None:
                attn_flops, kv_bytes, kv_sliding = summed
                sampled = 1.0 if last_chunk else 0.0
                linear = 2.0 * (self.matmul_params * n + self.head_params * sampled) / self.tp
                return (n, 1.0, sampled, linear, attn_flops, kv_bytes, self.expert_flops_per_token * n / self.tp,
                        kv_sliding)
        dtype_bytes = self.dtype_bytes
        attn_flops = 0.0
        kv_bytes = 0.0
        kv_sliding = 0.0
        for window, flops_per_key, kv_elements in self.layers:
            attn_flops += flops_per_key * _causal_keys(p, n, window)
            prior_read = p if window is None else min(p, window)
            # read prior KV once, write the chunk's own KV once
            layer_bytes = (prior_read + n) * kv_elements * dtype_bytes
            kv_bytes += layer_bytes
            if window is not None:
                kv_sliding += layer_bytes
        sampled = 1.0 if last_chunk else 0.0
        linear = 2.0 * (self.matmul_params * n + self.head_params * sampled) / self.tp
        return (n, 1.0, sampled, linear, attn_flops, kv_bytes, self.expert_flops_per_token * n / self.tp, kv_sliding)


#: Whole numbers up to this are exact in a float64, and so are sums of them that stay below it.
_EXACT_INT = 2 ** 53


def _integer_layer_groups(layers, dtype_bytes: int) -> tuple | None:
    """``((window, attention FLOPs per key, KV bytes per token), ...)`` summed over the layers of each window,
    as integers; None when a per-layer figure is not a whole number (then no exact shortcut exists)."""
    groups: dict = {}
    for window, flops_per_key, kv_elements in layers:
        kv = kv_elements * dtype_bytes
        if not (float(flops_per_key).is_integer() and float(kv).is_integer()):
            return None
        f, b = groups.get(window, (0, 0))
        groups[window] = (f + int(flops_per_key), b + int(kv))
    return tuple((w, f, b) for w, (f, b) in groups.items())


def _attention_and_kv_in_integers(groups, n: int, p: int) -> tuple[float, float, float] | None:
    """A prefill chunk's attention FLOPs, KV bytes and sliding-window layers' KV bytes, summed over layer
    groups in integers.

    :class:`PrefillWork` adds one whole number per layer in floats; while every term and partial
    sum is below 2**53 each of those additions is exact, so the integer sum here is the same float.
    None when a sum reaches 2**53 (then the caller adds per layer, as before).
    """
    if n * (n + 1) >= _EXACT_INT:
        return None
    attn = kv = sliding = 0
    for window, flops_per_key, kv_per_token in groups:
        if window is None:
            keys, prior_read = n * p + n * (n + 1) // 2, p
        else:
            k = min(max(window - p, 0), n)  # queries whose position is <= window
            keys, prior_read = k * p + k * (k + 1) // 2 + (n - k) * window, min(p, window)
        attn += flops_per_key * keys
        layer_kv = (prior_read + n) * kv_per_token
        kv += layer_kv
        if window is not None:
            sliding += layer_kv
    if attn >= _EXACT_INT or kv >= _EXACT_INT:
        return None
    return float(attn), float(kv), float(sliding)


def prompt_chunks(prompt_tokens: int, chunk_tokens: int) -> list[tuple[int, int]]:
    """``(tokens, prior_tokens)`` of each chunk when a prompt is prefilled ``chunk_tokens`` at a time."""
    if chunk_tokens < 1:
        raise ServebookError("the prefill chunk (max-num-batched-tokens) must be >= 1 token")
    out, done = [], 0
    while done < prompt_tokens:
        n = min(chunk_tokens, prompt_tokens - done)
        out.append((n, done))
        done += n
    return out


def allreduce_count(spec: ModelSpec, tp: int) -> int:
    """All-reduces per forward pass under tensor parallelism (attention and MLP output per layer)."""
    return 0 if tp == 1 else 2 * spec.num_layers


def allreduce_bytes(spec: ModelSpec, tokens, tp: int):
    """Bytes one all-reduce moves: a ``tokens x hidden`` activation in bf16 (0 when ``tp == 1``).

    A float for a number of tokens, a numpy array for an array of them."""
    return _allreduce_bytes(spec, _float_or_array(tokens, "allreduce_bytes over arrays"), tp)


def _allreduce_bytes(spec: ModelSpec, t, tp: int):
    """:func:`allreduce_bytes` of a float or float array ``t`` (a float for a float)."""
    if tp == 1:
        return 0.0 * t
    return t * spec.hidden_size * ACTIVATION_BYTES


def kv_bytes_per_sequence(spec: ModelSpec, context_tokens, *, tp: int = 1,
                          kv_cache_dtype: str | int = "auto", sliding_extra_tokens: int = 0,
                          running: bool = False):
    """KV bytes one GPU holds for one sequence of ``context_tokens`` tokens (a number, or an array).

    The one home of this arithmetic is :mod:`servebook.kv_cache` (the model's KV layout): sliding
    layers hold at most ``window - 1 + sliding_extra_tokens``, vLLM's admission booking (pass
    the in-flight tokens, :func:`servebook.kv_cache.admission_bytes`); with ``running=True``
    they hold what a decoding sequence keeps with async scheduling, the CUDA default
    (:func:`servebook.kv_cache.mean_running_bytes`: blocks that left the window are freed).
    Layers that reuse another layer's cache hold nothing. Block rounding of full layers is
    ignored (:func:`servebook.kv_cache.capacity` counts vLLM's pages exactly).
    """
    from servebook.kv_cache import admission_bytes, kv_cache_layout, mean_running_bytes

    from servebook.vllm_rules.cache import KV_DTYPE_BYTES

    dtype = kv_cache_dtype
    if not isinstance(kv_cache_dtype, str):   # a byte count: the first dtype name of that width
        kv_dtype_bytes(kv_cache_dtype)
        dtype = next(name for name, size in KV_DTYPE_BYTES.items() if size == kv_cache_dtype)
    layout = kv_cache_layout(spec, kv_cache_dtype=dtype, tp=tp)

    def one(ctx: float) -> float:
        if running:
            return mean_running_bytes(layout, [ctx], [1.0], unsettled_tokens=decode_unsettled_tokens(True))
        return admission_bytes(layout, ctx, in_flight_tokens=sliding_extra_tokens)

    if is_number(context_tokens):
        return one(float(context_tokens))
    np = require_numpy("kv_bytes_per_sequence over arrays")
    return np.array([one(float(c)) for c in np.asarray(context_tokens, dtype=float).ravel()]).reshape(
        np.shape(context_tokens))


