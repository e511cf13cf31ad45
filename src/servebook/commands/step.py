"""``servebook step``: predicted time of one vLLM engine step (prefill or decode).

    servebook step --config PATH --gpu NAME [--tp N] --phase prefill --tokens N [--json]
    servebook step --config PATH --gpu NAME [--tp N] --phase decode --batch B --context C [--json]

``--context`` is the mean context (tokens) of the running sequences. Times come
from the step-time model with coefficients calibrated on recorded vLLM runs
(``servebook/perf/data/calibration.json``).
"""
from __future__ import annotations

import json

from servebook.errors import ServebookError
from servebook.vllm_rules import DEFAULT_CUDAGRAPH_MAX_TOKENS, DEFAULT_GPU_MEMORY_UTILIZATION


def register(sub) -> None:
    p = sub.add_parser("step", help="predicted seconds of one prefill or decode step (calibrated model)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="config.json path, model directory or reference id")
    p.add_argument("--gpu", required=True, help="GPU name from the catalogue (e.g. h200, h100-sxm)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    p.add_argument("--phase", required=True, choices=("prefill", "decode"))
    p.add_argument("--tokens", type=int, help="prefill: prompt tokens processed in the step")
    p.add_argument("--prior-tokens", type=int, default=0, help="prefill: tokens already cached before this chunk")
    p.add_argument("--batch", type=int, help="decode: running sequences")
    p.add_argument("--context", type=float, help="decode: mean context of the running sequences, tokens")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto (model dtype) or fp8")
    p.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION,
                   help="fraction of GPU memory vLLM may use, for the KV capacity check "
                        f"(default {DEFAULT_GPU_MEMORY_UTILIZATION}, vLLM's)")
    p.add_argument("--cudagraph-max-tokens", type=int, default=None,
                   help="largest step vLLM replays as a CUDA graph; bigger steps run eagerly (default: vLLM's "
                        f"rule for vllm serve's batch defaults on the GPU, {DEFAULT_CUDAGRAPH_MAX_TOKENS} on an H200)")
    p.add_argument("--calibration", help="calibration record to use instead of the shipped one")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from servebook.validation import validate_step_args

    validate_step_args(args)  # every flag, before any work
    from servebook.hf_config import load_model_spec
    from servebook.perf.fleet import check_decode_fits
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients, decode_step, prefill_step
    from servebook.perf.work import check_sequence_length
    from servebook.vllm_rules import check_tp, cudagraph_max_tokens, vllm_batch_defaults

    spec = load_model_spec(args.config)
    gpu = gpu_numbers(args.gpu)
    check_tp(spec, args.tp)
    coeffs, where = calibrated_coefficients(gpu.name, args.calibration)
    if args.cudagraph_max_tokens is None:
        # vLLM's rule for vllm serve's batch defaults on this GPU (servebook plan resolves them alike)
        default_tokens, default_seqs = vllm_batch_defaults(int(gpu.memory_bytes), gpu.name,
                                                           max_model_len=spec.max_position_embeddings or None)
        args.cudagraph_max_tokens = cudagraph_max_tokens(default_seqs, default_tokens, architecture=spec.architecture)
    notes = [where]
    if args.tp > 1 and not coeffs.tp_calibrated:
        notes.append("TP all-reduce not calibrated: bandwidth term at peak link speed only (a lower bound)")
    out = {"model": spec.name, "gpu": gpu.name, "tp": args.tp, "phase": args.phase,
           "kv_cache_dtype": args.kv_cache_dtype}
    if args.phase == "prefill":
        if args.tokens is None or args.tokens < 1:
            raise ServebookError("--phase prefill needs --tokens N (N >= 1)")
        if args.batch is not None or args.context is not None:
            raise ServebookError("--batch/--context belong to --phase decode; prefill takes --tokens")
        if args.prior_tokens < 0:
            raise ServebookError("--prior-tokens must be >= 0")
        total = args.tokens + args.prior_tokens
        check_sequence_length(spec, total, "the prompt (--tokens + --prior-tokens)", "use a shorter prompt")
        check_decode_fits(spec, gpu, batch=1, context_tokens=total, tp=args.tp, kv_cache_dtype=args.kv_cache_dtype,
                          gpu_memory_utilization=args.gpu_memory_utilization,
                          max_num_batched_tokens=max(args.tokens, 1))
        b = prefill_step(spec, gpu, coeffs, tokens=args.tokens, prior_tokens=args.prior_tokens, tp=args.tp,
                         kv_cache_dtype=args.kv_cache_dtype, cudagraph_max_tokens=args.cudagraph_max_tokens)
        out.update(tokens=args.tokens, prior_tokens=args.prior_tokens)
        if args.prior_tokens == 0:
            out["request_s"] = b.step_s + coeffs.request_overhead_s
            out["tokens_per_s"] = args.tokens / b.step_s
    else:
        if args.batch is None or args.context is None:
            raise ServebookError("--phase decode needs --batch B and --context C (mean tokens per sequence)")
        if args.tokens is not None:
            raise ServebookError("--tokens belongs to --phase prefill; decode takes --batch and --context")
        if args.batch < 1 or args.context < 0:
            raise ServebookError("--batch must be >= 1 and --context >= 0 tokens")
        check_sequence_length(spec, args.context + 1, "--context plus the token being decoded", "lower --context")
        limit = check_decode_fits(spec, gpu, batch=args.batch, context_tokens=args.context, tp=args.tp,
                                  kv_cache_dtype=args.kv_cache_dtype,
                                  gpu_memory_utilization=args.gpu_memory_utilization)
        b = decode_step(spec, gpu, coeffs, batch=args.batch, context_tokens=args.context, tp=args.tp,
                        kv_cache_dtype=args.kv_cache_dtype, cudagraph_max_tokens=args.cudagraph_max_tokens)
        out.update(batch=args.batch, context=args.context, kv_batch_limit=limit,
                   tokens_per_s=args.batch / b.step_s)
    out["step_s"] = b.step_s
    out["breakdown"] = b.to_dict()
    out["notes"] = notes
    from servebook.perf.error_bands import Query, assess, band_text, scaled

    tokens = args.tokens if args.phase == "prefill" else args.batch
    band = assess(Query("step", spec, gpu.name, tp=args.tp, step=args.phase, graph=tokens <= args.cudagraph_max_tokens,
                        context_tokens=(args.tokens + args.prior_tokens) if args.phase == "prefill" else args.context,
                        kv_cache_dtype=args.kv_cache_dtype))
    out["error_band"] = band | {"of": "step_s", "step_s_range": scaled(b.step_s, band["band"])}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{spec.name} on {gpu.name} x tp={args.tp}, {args.phase}: step {b.step_s * 1e3:.2f} ms "
              f"({b.bound}-bound linear layers)")
        r = out["error_band"]["step_s_range"]
        print("    " + band_text(band, "points") + (f": {r[0] * 1e3:.2f} to {r[1] * 1e3:.2f} ms"
                                                    if r and not band["outside"] else ""))
        print(f"  overhead {b.overhead_s * 1e3:.2f} ms, linear {b.linear_s * 1e3:.2f} ms, "
              f"attention {b.attention_s * 1e3:.2f} ms, all-reduce {b.allreduce_s * 1e3:.2f} ms")
        if "tokens_per_s" in out:
            print(f"  {out['tokens_per_s']:.0f} tokens/s")
        for n in notes:
            print(f"  note: {n}")
    return 0
