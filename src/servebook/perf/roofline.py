"""Roofline view: arithmetic intensity of a step against the GPU's ridge point.

Arithmetic intensity = FLOPs / bytes read from HBM in one step. Below the
GPU's ridge (peak FLOP/s / peak bytes/s, about 206 FLOP/byte for an H200 in
bf16) a step is memory-bound: it cannot go faster than its bytes allow, and
adding sequences to the batch is nearly free. Decode of a dense model gains
about 2 FLOPs per weight byte per sequence; an MoE gains much less, because a
bigger batch also touches more distinct experts (more bytes), and the KV cache
read grows with the batch too.
"""
from __future__ import annotations

from servebook.model_spec import ModelSpec
from servebook.perf.gpu import gpu_numbers
from servebook.perf.work import decode_work, dense_weight_bytes_read, expert_weight_bytes_read, prefill_work
from servebook.reductions import as_floats, is_number


def _vector(values: list[float]):
    """``values`` as a numpy array when numpy is installed (for plots and array arithmetic), else the list."""
    try:
        import numpy as np
    except ImportError:
        return values
    return np.array(values, dtype=float)




def decode_intensity(spec: ModelSpec, batches, context_tokens: float, *, tp: int = 1,
                     kv_cache_dtype: str = "auto") -> dict:
    """FLOPs, bytes and FLOP/byte of one decode step for each batch size (per GPU).

    Values are numpy arrays when numpy is installed, lists of floats otherwise (computed in floats either way).
    """
    b = as_floats(batches)
    flops, nbytes = [], []
    for batch in b:
        w = decode_work(spec, batch, context_tokens, tp=tp, kv_cache_dtype=kv_cache_dtype)
        flops.append(w.linear_flops + w.attention_flops)
        nbytes.append(dense_weight_bytes_read(spec, tp) + float(expert_weight_bytes_read(spec, w.tokens, tp))
                      + w.kv_read_bytes)
    return {"batch": _vector(b), "flops": _vector(flops), "bytes": _vector(nbytes),
            "intensity_flops_per_byte": _vector([f / n for f, n in zip(flops, nbytes)])}


def prefill_intensity(spec: ModelSpec, tokens, *, tp: int = 1) -> dict:
    """FLOPs, bytes and FLOP/byte of prefilling one prompt of each length in one step (per GPU).

    Values are numpy arrays when numpy is installed, lists of floats otherwise.
    """
    n = as_floats(tokens)
    flops, nbytes = [], []
    for t in n:
        w = prefill_work(spec, int(t), tp=tp)
        flops.append(w.linear_flops + w.attention_flops)
        nbytes.append(dense_weight_bytes_read(spec, tp) + float(expert_weight_bytes_read(spec, t, tp))
                      + w.kv_read_bytes)
    return {"tokens": _vector(n), "flops": _vector(flops), "bytes": _vector(nbytes),
            "intensity_flops_per_byte": _vector([f / b for f, b in zip(flops, nbytes)])}


def attainable_flops(gpu, intensity):
    """Roofline ceiling: ``min(peak FLOP/s, bandwidth x intensity)`` in FLOP/s (bf16).

    A float for a number, a numpy array (a list without numpy) for an array or list.
    """
    g = gpu_numbers(gpu)
    if is_number(intensity):
        return min(g.bf16_dense_flops, g.hbm_bandwidth_bytes_per_s * float(intensity))
    return _vector([min(g.bf16_dense_flops, g.hbm_bandwidth_bytes_per_s * i) for i in as_floats(intensity)])


def ridge_batch(spec: ModelSpec, gpu, context_tokens: float, *, tp: int = 1, kv_cache_dtype: str = "auto",
                max_batch: int = 1 << 16) -> int | None:
    """Smallest decode batch whose step intensity reaches the GPU's ridge point; None if none up to max_batch."""
    ridge = gpu_numbers(gpu).ridge_flops_per_byte
    b = 1
    while b <= max_batch:
        if decode_intensity(spec, [b], context_tokens, tp=tp, kv_cache_dtype=kv_cache_dtype)[
                "intensity_flops_per_byte"][0] >= ridge:
            lo, hi = b // 2, b
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if decode_intensity(spec, [mid], context_tokens, tp=tp, kv_cache_dtype=kv_cache_dtype)[
                        "intensity_flops_per_byte"][0] >= ridge:
                    hi = mid
                else:
                    lo = mid
            return max(hi, 1)
        b *= 2
    return None
