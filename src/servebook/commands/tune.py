"""``servebook tune``: the cheapest deployment that meets TTFT/TPOT targets at an arrival rate.

    servebook tune --config MODEL --gpu h200 --gpus 8 --rate 12 --input-tokens 1024 \\
        --output-tokens 256 --ttft-ms 500 --tpot-ms 40 [--percentile 90] [--price-per-gpu-hour 3] \\
        [--prefix-tokens 512 --prefix-share 0.5] [--speculative ngram:k=4,alpha=0.6]

Searches TP, replicas, KV cache dtype, ``--max-num-seqs`` and ``--max-num-batched-tokens`` on
vLLM's serve defaults, and prefix caching when the prompts share a prefix, predicting each
candidate's latency with the scheduler simulator, the calibrated step model and the measured
serving path (``servebook.simulator.tune``). Speculative decoding is reported on, not searched.
"""
from __future__ import annotations

import json

from servebook.errors import ServebookError


def register(sub) -> None:
    p = sub.add_parser("tune", help="cheapest deployment meeting TTFT/TPOT targets at an arrival rate",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="config.json path, model directory or reference id")
    p.add_argument("--gpu", required=True, help="GPU name from the catalogue (e.g. h200, h100-sxm)")
    p.add_argument("--gpus", type=int, required=True, help="the most GPUs the deployment may use")
    p.add_argument("--rate", type=float, required=True, help="arrival rate, requests/s (all replicas)")
    p.add_argument("--input-tokens", type=int, required=True, help="mean prompt length, tokens")
    p.add_argument("--output-tokens", type=int, required=True, help="mean output length, tokens")
    p.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths uniform in [L(1-r), L(1+r)] (default 0: fixed), as vllm bench serve's random dataset")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps (1 = Poisson)")
    p.add_argument("--prefix-tokens", type=int, default=0,
                   help="leading prompt tokens the requests share (a system prompt; part of --input-tokens). "
                        "Candidates are simulated with vLLM's prefix caching on (its default), the hits "
                        "skipping their prefill; the pick also with it off, for comparison")
    p.add_argument("--prefix-share", type=float, default=1.0,
                   help="fraction of requests that carry the shared prefix, in [0, 1] (default 1: all)")
    p.add_argument("--speculative", default=None, metavar="METHOD:k=K,alpha=A[,model=REF]",
                   help="speculative decoding to report on (ngram, or draft_model with model=REF), with k draft "
                        "tokens and per-token acceptance alpha, e.g. ngram:k=4,alpha=0.6. Not searched: the "
                        "simulator serves one token per request per step; tune prints what the step model "
                        "alone prices for the pick's batch")
    p.add_argument("--ttft-ms", type=float, help="time-to-first-token target, ms")
    p.add_argument("--tpot-ms", type=float, help="time-per-output-token target, ms")
    p.add_argument("--e2e-s", type=float, help="end-to-end latency target, s")
    p.add_argument("--percentile", type=int, default=90, choices=(50, 90, 99), help="percentile of the targets")
    p.add_argument("--headroom", type=float, default=None,
                   help="a prediction must beat its target by this fraction (default: the model's accuracy "
                        "goal, 0.15 at p50, 0.25 at p90/p99)")
    p.add_argument("--tp", default="1,2,4,8", help="TP sizes to search, comma-separated (default 1,2,4,8)")
    p.add_argument("--kv-cache-dtypes", default="auto,fp8", type=_dtypes,
                   help="KV cache dtypes to search, comma-separated (default auto,fp8)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="engine context, tokens (default: the longest request, rounded up to 1,024)")
    p.add_argument("--price-per-gpu-hour", type=float, default=None, help="price of one GPU-hour (any currency)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _tps(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ServebookError(f"--tp takes comma-separated integers like 1,2,4, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ServebookError(f"--tp takes positive integers like 1,2,4, got {text!r}")
    return values


def _dtypes(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def run(args) -> int:
    from servebook.simulator.online import OnlineWorkload
    from servebook.simulator.tune import LatencyTargets, tune
    from servebook.validation import validate_tune_args

    from servebook.perf.speculative import parse_speculative

    validate_tune_args(args)   # every flag, before any work (an unknown GPU names the catalogue)
    speculative = None if args.speculative is None else parse_speculative(args.speculative)
    workload = OnlineWorkload(args.rate, args.input_tokens, args.output_tokens, range_ratio=args.range_ratio,
                              burstiness=args.burstiness, prefix_tokens=args.prefix_tokens,
                              prefix_share=args.prefix_share)
    targets = LatencyTargets(ttft_s=None if args.ttft_ms is None else args.ttft_ms / 1e3,
                             tpot_s=None if args.tpot_ms is None else args.tpot_ms / 1e3,
                             e2e_s=args.e2e_s, percentile=args.percentile, headroom=args.headroom)
    result = tune(args.config, gpu=args.gpu, max_gpus=args.gpus, workload=workload, targets=targets,
                  price_per_gpu_hour=args.price_per_gpu_hour, max_model_len=args.max_model_len, tps=_tps(args.tp),
                  kv_cache_dtypes=args.kv_cache_dtypes, speculative=speculative)
    print(json.dumps(to_json(result), indent=1) if args.json else render(result))
    return 0 if result.best else 1


def to_json(result) -> dict:
    from servebook.simulator.online import latency_band, latency_band_text
    from servebook.simulator.tune import WATCH

    best = result.best
    return {"best": None if best is None else {**best.to_dict(), "cost_per_hour": result.cost_per_hour(best),
                                               "cost_per_million_output_tokens": result.cost_per_million_output_tokens(best)},
            "binding": result.binding or None, "frontier": [c.to_dict() for c in result.frontier()],
            "tried": len(result.tried), "error_band": latency_band(result.gpu),
            "watch": [{"metric": m, "why": w} for m, w in WATCH], "notes": list(result.notes)}


def _ms(x: float) -> str:
    return f"{x * 1e3:.0f} ms" if x < 10 else f"{x:.1f} s"


def render(result) -> str:
    from servebook.simulator.online import latency_band, latency_band_text
    from servebook.simulator.tune import WATCH

    w, t, q = result.workload, result.targets, result.targets.percentile
    spread = f" ±{w.range_ratio:.0%}" if w.range_ratio else ""
    arrivals = "Poisson" if w.burstiness == 1 else f"gamma gaps, burstiness {w.burstiness:g}"
    goals = [f"p{q} {n} <= {_ms(v)}" for n, v in (("TTFT", t.ttft_s), ("TPOT", t.tpot_s), ("end-to-end", t.e2e_s))
             if v is not None]
    prefix = (f"; a {w.prefix_tokens}-token shared prefix on {w.prefix_share:.0%} of them" if w.shares_prefix else "")
    lines = [f"{w.rate_per_s:g} requests/s ({arrivals}; prompts {w.input_tokens}{spread}{prefix}, outputs "
             f"{w.output_tokens}{spread} tokens) on at most {result.max_gpus} {result.gpu.upper()}",
             f"targets: {', '.join(goals)}; a prediction must beat each by {t.factor - 1:.0%} (the model's error allowance)",
             ""]
    best = result.best
    if best is None:
        lines += ["nothing tried meets the targets.", result.binding]
    else:
        p, plan = best.prediction, best.plan
        lines += [f"cheapest that meets them: {best.replicas} replica(s) x TP {plan.tp} = {best.gpus} GPU(s); "
                  f"flags: {result.flags_text(best)}",
                  f"  {best.serve_command()}",
                  f"  each replica at {p.rate_per_s:.3g} requests/s: TTFT p50 {_ms(p.ttft_s[50])}, p90 {_ms(p.ttft_s[90])}; "
                  f"TPOT p50 {_ms(p.tpot_s[50])}, p90 {_ms(p.tpot_s[90])}",
                  f"  throughput: {best.output_tokens_per_s_per_gpu:.0f} output tokens/s per GPU"]
        cost = result.cost_per_million_output_tokens(best)
        if cost is not None:
            lines.append(f"  cost: {result.cost_per_hour(best):.2f} per hour, {cost:.3f} per million output tokens")
        lines.append(f"  error band: {latency_band_text(latency_band(result.gpu), result.gpu)}")
    lines += ["", f"Pareto frontier of the {len(result.tried)} candidates tried, among those that keep up "
              f"(higher tokens/s per GPU, lower p{q} TPOT):",
              f"  {'GPUs':>4} {'TP':>3} {'repl':>4} {'flags':<44} {'tok/s/GPU':>9} {'TTFT p' + str(q):>10} {'TPOT p' + str(q):>10} meets"]
    for c in result.frontier()[:10]:
        flags = result.flags_text(c)
        lines.append(f"  {c.gpus:>4} {c.plan.tp:>3} {c.replicas:>4} {flags:<44} {c.output_tokens_per_s_per_gpu:>9.0f} "
                     f"{_ms(c.prediction.ttft_s[q]):>10} {_ms(c.prediction.tpot_s[q]):>10} {'yes' if c.meets else 'no'}")
    lines += ["", "what to watch once deployed (vLLM's /metrics):"] + [f"  {m}: {why}" for m, why in WATCH]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)
