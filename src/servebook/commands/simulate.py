"""``servebook simulate``: run the scheduler simulator on a synthetic workload."""
from __future__ import annotations

import json
import math

from servebook.simulator import (LENGTH_PRESETS, POLICIES, RESERVATIONS, SchedulerConfig, simulate,
                                 synthetic_workload_with_truncation)


def register(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate vLLM's scheduler (paged KV, continuous batching) or a baseline policy",
        description="Discrete-event simulation of a vLLM 0.27.1-like step loop on a synthetic "
        "workload. Step times come from a simple stand-in cost model (illustrative, not measured).",
    )
    p.add_argument("--requests", type=int, required=True, help="number of requests")
    p.add_argument("--policy", choices=POLICIES, default="paged", help="allocation/batching policy")
    p.add_argument("--reservation", choices=RESERVATIONS, default="max",
                   help="contiguous/static: slots reserved per request (default max_model_len)")
    p.add_argument("--rate", type=float, default=math.inf, help="arrival rate in requests/s (default: all at t=0)")
    p.add_argument("--lengths", choices=sorted(LENGTH_PRESETS), default="sharegpt-like",
                   help="prompt/output length distribution")
    p.add_argument("--num-blocks", type=int, default=4096, help="usable KV blocks")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--long-prefill-token-threshold", type=int, default=0)
    p.add_argument("--shared-prefix-tokens", type=int, default=0, help="tokens of a prompt prefix all requests share")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print JSON (summary and config)")
    p.add_argument("--steps", action="store_true", help="with --json: include the per-step trace and per-request metrics")
    p.set_defaults(func=run)


def run(args) -> int:
    config = SchedulerConfig(
        num_blocks=args.num_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        enable_prefix_caching=not args.no_prefix_caching, policy=args.policy, reservation=args.reservation,
    )
    requests, truncation = synthetic_workload_with_truncation(
        args.requests, arrival_rate_per_s=args.rate, lengths=args.lengths, max_model_len=args.max_model_len,
        shared_prefix_tokens=args.shared_prefix_tokens, seed=args.seed,
    )
    result = simulate(requests, config)
    if args.json:
        data = json.loads(result.to_json(include_steps=args.steps))
        data["truncation"] = truncation.to_dict()
        print(json.dumps(data, indent=2))
        return 0
    s = result.summary()
    rows = [
        ("policy", s["policy"] + ("" if s["policy"] == "paged" else f" ({config.reservation} reservation)")),
        ("requests", s["num_requests"]),
        ("steps", s["num_steps"]),
        ("makespan", f"{s['makespan_s']:.2f} s"),
        ("throughput", f"{s['output_tokens_per_s']:.0f} output tokens/s, {s['requests_per_s']:.2f} requests/s"),
        ("TTFT", f"mean {s['ttft_mean_s']:.3f} s, p50 {s['ttft_p50_s']:.3f} s, p99 {s['ttft_p99_s']:.3f} s"),
        ("inter-token", f"mean {s['itl_mean_s'] * 1000:.1f} ms"),
        ("latency", f"mean {s['latency_mean_s']:.2f} s, p99 {s['latency_p99_s']:.2f} s"),
        ("preemptions", s["preemptions"]),
        ("KV holding tokens", f"{s['kv_utilisation'] * 100:.1f}% of reserved KV memory (time-weighted)"),
        ("mean running", f"{s['mean_running']:.1f} sequences"),
    ]
    if truncation.requests:
        rows.insert(2, ("truncated", truncation.describe(len(requests))))
    for key, value in rows:
        print(f"{key:18s}{value}")
    print("step times: illustrative stand-in cost model (servebook.simulator.LinearStepTime), not a measurement")
    return 0
