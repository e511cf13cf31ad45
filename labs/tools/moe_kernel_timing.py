#!/usr/bin/env python3
"""Time vLLM's fused-MoE Triton kernels on a grid of expert shapes and token counts, with provenance.

Usage (on the GPU node, inside the vLLM environment):
    python labs/tools/moe_kernel_timing.py --out OUT.json [--deadline-s 300]

Why: the step-time model prices a routed expert's GEMMs with one efficiency curve over rows per
expert, fitted on the one MoE shape the step sweeps cover (Qwen3-30B-A3B: 128 experts of 2,048 x 768).
A GEMM's efficiency also depends on its size (tiles per expert, length of the inner loop), which one
shape cannot show. This tool measures the kernel the engine runs for 16-bit experts (vLLM 0.26.0 logs
"Using TritonExperts MoE backend" for every MoE model recorded here) on expert shapes that vLLM ships a
tuned H200 configuration for, so each shape runs with the block sizes the engine would pick.

Method, per shape (E experts, intermediate size N, hidden size H, top-k) and token count T:
- routing as vLLM's ``VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random`` draws it: ``randint(0, E)``
  for each of a token's k slots; router weights random and normalised per token;
- ``layers`` distinct weight sets (so the bytes one timed pass reads are well above the L2 cache, as in
  a model whose other layers evict it), run one after another inside one CUDA graph;
- the graph is replayed ``reps`` times between CUDA events, three trials; the record keeps every
  trial's seconds per layer (time / reps / layers) and the fastest.
Shapes whose (E, N) matches a model the book holds out (``held_out``) are measured as well and marked,
so a fit can leave them out and test on them.

Schema ``servebook.moe_kernel_timing/1`` (see labs/results/README.md).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from servebook.provenance import device_info, utc_now_iso, vllm_version  # noqa: E402

#: (label, experts, intermediate size N, hidden size H, top-k, why this shape). N is the size vLLM's
#: tuned-config file names use (w2's inner dimension), H the model's hidden size.
SHAPES = [
    ("qwen3-30b-a3b", 128, 768, 2048, 8, "Qwen3-30B-A3B (the MoE shape the step model is fitted on)"),
    ("mixtral-8x22b-tp2", 8, 8192, 6144, 2, "Mixtral-8x22B's experts split 2 ways"),
    ("mixtral-8x22b-tp4", 8, 4096, 6144, 2, "Mixtral-8x22B's experts split 4 ways"),
    ("mixtral-8x7b", 8, 14336, 4096, 2, "Mixtral-8x7B (held out: its engine runs test the step model)"),
    ("qwen2-57b-a14b", 64, 2560, 3584, 8, "Qwen2-57B-A14B"),
    ("deepseek-v2-lite", 64, 1408, 2048, 6, "DeepSeek-V2-Lite (no tuned H200 config: vLLM's default blocks)"),
    ("qwen3-235b-a22b-tp4", 128, 384, 4096, 8, "Qwen3-235B-A22B's experts split 4 ways"),
    ("e128-n1024-h4096", 128, 1024, 4096, 8, "a 128-expert shape with a tuned config"),
    ("qwen3-next-80b-a3b", 512, 512, 2048, 10, "Qwen3-Next-80B-A3B (512 experts, top-10)"),
    ("qwen2-57b-a14b-tp2", 64, 1280, 3584, 8, "Qwen2-57B-A14B's experts split 2 ways"),
    ("qwen2-57b-a14b-tp4", 64, 640, 3584, 8, "Qwen2-57B-A14B's experts split 4 ways"),
    ("mixtral-8x7b-tp2", 8, 7168, 4096, 2, "Mixtral-8x7B's experts split 2 ways"),
    ("mixtral-8x7b-tp4", 8, 3584, 4096, 2, "Mixtral-8x7B's experts split 4 ways"),
    ("mixtral-8x7b-tp8", 8, 1792, 4096, 2, "Mixtral-8x7B's experts split 8 ways"),
    ("qwen3-235b-a22b-tp8", 128, 192, 4096, 8, "Qwen3-235B-A22B's experts split 8 ways"),
]
#: Shapes whose engine runs test the step model: a fit must not use them.
HELD_OUT = {"mixtral-8x7b", "qwen2-57b-a14b"}
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
#: Bytes of weights one timed pass should read, well above the H200's L2 cache (tens of MiB).
PASS_WEIGHT_BYTES = 1.5e9


def _tuned_config_file(E: int, N: int) -> str | None:
    from vllm.model_executor.layers.fused_moe import fused_moe as fm

    name = fm.get_config_file_name(E, N, None)
    path = Path(fm.__file__).parent / "configs" / name
    return name if path.exists() else None


def _kernel_config(w1, w2, k: int, T: int) -> dict:
    from vllm.model_executor.layers.fused_moe import fused_moe as fm

    try:
        return dict(fm.try_get_optimal_moe_config(tuple(w1.shape), tuple(w2.shape), k, None, T))
    except Exception as exc:  # the record says so rather than guess
        return {"error": repr(exc)}


def time_shape(label, E, N, H, k, tokens, deadline):
    import torch
    from vllm.model_executor.layers.fused_moe import fused_experts

    try:  # the custom ops (moe_align_block_size) the kernels need
        import vllm._custom_ops  # noqa: F401
    except ImportError:
        pass
    dev = torch.device("cuda")
    layer_bytes = E * 3 * N * H * 2
    layers = max(1, min(8, math.ceil(PASS_WEIGHT_BYTES / layer_bytes)))
    gen = torch.Generator(device=dev).manual_seed(0)
    w1 = [torch.randn(E, 2 * N, H, device=dev, dtype=torch.bfloat16, generator=gen) * 0.02 for _ in range(layers)]
    w2 = [torch.randn(E, H, N, device=dev, dtype=torch.bfloat16, generator=gen) * 0.02 for _ in range(layers)]
    points = []
    for T in tokens:
        if time.time() > deadline:
            points.append({"tokens": T, "skipped": "deadline"})
            continue
        x = torch.randn(T, H, device=dev, dtype=torch.bfloat16, generator=gen) * 0.1
        ids = torch.randint(0, E, (T, k), device=dev, dtype=torch.int32, generator=gen)
        wts = torch.rand(T, k, device=dev, dtype=torch.float32, generator=gen)
        wts = wts / wts.sum(dim=1, keepdim=True)

        def one_pass():
            out = None
            for i in range(layers):
                out = fused_experts(x, w1[i], w2[i], wts, ids)
            return out

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):  # JIT-compiles the kernels for this T's config, then warms up
                one_pass()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        method = "cuda_graph"
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                one_pass()
            run = graph.replay
        except Exception as exc:
            method = f"eager ({type(exc).__name__})"
            torch.cuda.synchronize()
            run = one_pass
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        once_s = max(start.elapsed_time(end) / 1e3, 1e-6)
        reps = max(3, min(200, int(0.03 / once_s)))
        trials = []
        for _ in range(3):
            start.record()
            for _ in range(reps):
                run()
            end.record()
            torch.cuda.synchronize()
            trials.append(start.elapsed_time(end) / 1e3 / reps / layers)
        distinct = torch.unique(ids).numel()
        points.append({"tokens": T, "seconds_per_layer": min(trials), "trials_s": trials, "reps": reps,
                       "method": method, "distinct_experts": int(distinct),
                       "kernel_config": _kernel_config(w1[0], w2[0], k, T)})
        del x, ids, wts
        if method == "cuda_graph":
            del graph
    del w1, w2
    torch.cuda.empty_cache()
    return {"layers_per_pass": layers, "points": points}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline-s", type=float, default=300, help="stop starting new points after this")
    ap.add_argument("--shapes", default="", help="comma-separated labels (default: all)")
    args = ap.parse_args()
    t0 = time.time()
    deadline = t0 + args.deadline_s
    import torch
    import triton

    doc = {"schema": "servebook.moe_kernel_timing/1", "date": utc_now_iso(), "gpu": device_info(),
           "vllm_version": vllm_version(), "torch_version": torch.__version__, "triton_version": triton.__version__,
           "environment": {k: v for k, v in os.environ.items() if k.startswith("VLLM_")},
           "method": ("vllm.model_executor.layers.fused_moe.fused_experts (bf16, silu, TritonExperts' kernels) "
                      "on uniform-random routing (randint per top-k slot, as VLLM_MOE_ROUTING_SIMULATION_STRATEGY="
                      "uniform_random); layers_per_pass distinct weight sets in one CUDA graph, replayed reps times "
                      "between CUDA events, three trials; seconds_per_layer = fastest trial / reps / layers"),
           "held_out": sorted(HELD_OUT), "tokens": TOKENS, "shapes": []}
    wanted = set(filter(None, args.shapes.split(",")))
    out = Path(args.out)
    for label, E, N, H, k, why in SHAPES:
        if wanted and label not in wanted:
            continue
        entry = {"label": label, "experts": E, "intermediate_size": N, "hidden_size": H, "top_k": k, "why": why,
                 "held_out": label in HELD_OUT, "tuned_config_file": _tuned_config_file(E, N)}
        if time.time() > deadline:
            entry["skipped"] = "deadline"
        else:
            t = time.time()
            try:
                entry.update(time_shape(label, E, N, H, k, TOKENS, deadline))
            except Exception as exc:
                entry["error"] = repr(exc)
            entry["wall_s"] = round(time.time() - t, 1)
            print(f"[{label}] {entry.get('wall_s')} s {entry.get('error', '')}", flush=True)
        doc["shapes"].append(entry)
        out.write_text(json.dumps(doc, indent=1))
    doc["wall_s"] = round(time.time() - t0, 1)
    out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
