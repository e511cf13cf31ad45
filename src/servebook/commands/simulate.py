"""``servebook simulate``: run the scheduler simulator on a synthetic workload."""
from __future__ import annotations

import json
import math

from servebook.errors import ServebookError
from servebook.vllm_rules import DEFAULT_GPU_MEMORY_UTILIZATION, check_tp_size
from servebook.simulator import (LENGTH_PRESETS, POLICIES, RESERVATIONS, LinearStepTime, SchedulerConfig, simulate,
                                 synthetic_workload_with_truncation)
from servebook.simulator.step_time import PerfStepTime, perf_step_time_for


def register(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate vLLM's scheduler (paged KV, continuous batching) or a baseline policy",
        description="Discrete-event simulation of a vLLM 0.27.1-like step loop on a synthetic "
        "workload. Step times come from the calibrated performance model (servebook.perf, the same "
        "as `servebook step`) when --config and --gpu are given: then TTFT, inter-token latency and "
        "throughput are seconds for that model on that GPU. Without --config they come from a simple "
        "stand-in cost model (LinearStepTime: illustrative, not measured; only relative timings mean "
        "anything).",
    )
    p.add_argument("--requests", type=int, required=True, help="number of requests")
    p.add_argument("--policy", choices=POLICIES, default="paged", help="allocation/batching policy")
    p.add_argument("--reservation", choices=RESERVATIONS, default="max",
                   help="contiguous/static: slots reserved per request (default max_model_len)")
    p.add_argument("--rate", type=float, default=math.inf, help="arrival rate in requests/s (default: all at t=0)")
    p.add_argument("--lengths", choices=sorted(LENGTH_PRESETS), default="sharegpt-like",
                   help="prompt/output length distribution")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="usable KV blocks (default: with the perf step model, what vLLM would allocate for the "
                   "model on the GPU per the memory model, less its null block; otherwise 4096)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--long-prefill-token-threshold", type=int, default=0)
    p.add_argument("--shared-prefix-tokens", type=int, default=0, help="tokens of a prompt prefix all requests share")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-model", choices=("linear", "perf"), default=None,
                   help="step cost: perf = calibrated performance model (needs --config and --gpu; the default "
                   "when --config is given), linear = illustrative stand-in (the default otherwise)")
    p.add_argument("--config", help="perf step model: config.json path, model directory or reference id (e.g. qwen3-32b)")
    p.add_argument("--gpu", help="perf step model: GPU name from the catalogue (e.g. h200)")
    p.add_argument("--tp", type=int, default=1, help="perf step model: tensor-parallel size (default 1)")
    p.add_argument("--kv-cache-dtype", default="auto", help="perf step model: auto (model dtype) or fp8")
    p.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION,
                   help="perf step model: fraction of GPU memory vLLM may use, for the default --num-blocks "
                        f"(default {DEFAULT_GPU_MEMORY_UTILIZATION}, vLLM's)")
    p.add_argument("--calibration", help="perf step model: calibration record instead of the shipped one")
    p.add_argument("--json", action="store_true", help="print JSON (summary and config)")
    p.add_argument("--steps", action="store_true", help="with --json: include the per-step trace and per-request metrics")
    p.set_defaults(func=run)


def _step_model(args):
    """The step cost model the arguments ask for, and a line saying what it is."""
    model = args.step_model or ("perf" if args.config else "linear")
    if model == "linear":
        if args.config or args.gpu or args.tp != 1:
            raise ServebookError("--config/--gpu/--tp price steps with the performance model; "
                                 "drop them or use --step-model perf")
        return LinearStepTime(), ("step times: illustrative stand-in cost model "
                                  "(servebook.simulator.LinearStepTime), not a measurement")
    missing = [flag for flag, value in (("--config", args.config), ("--gpu", args.gpu)) if not value]
    if missing:
        raise ServebookError(f"--step-model perf needs {' and '.join(missing)} "
                             "(e.g. --config llama-3.1-8b --gpu h200)")
    check_tp_size(args.tp)
    step, where = perf_step_time_for(args.config, args.gpu, tp=args.tp, kv_cache_dtype=args.kv_cache_dtype,
                                     max_num_seqs=args.max_num_seqs,
                                     max_num_batched_tokens=args.max_num_batched_tokens,
                                     calibration=args.calibration)
    return step, (f"step times: performance model for {step.spec.name} on {step.coeffs.gpu or args.gpu}, "
                  f"TP {args.tp} ({where})")


def run(args) -> int:
    from servebook.validation import validate_simulate_args

    validate_simulate_args(args)  # every flag, before any work
    step_model, step_note = _step_model(args)
    num_blocks = args.num_blocks
    if num_blocks is None:
        num_blocks = 4096
        if isinstance(step_model, PerfStepTime):
            from servebook.simulator.sizing import planned_num_blocks

            num_blocks = planned_num_blocks(args.config, args.gpu, tp=args.tp, max_model_len=args.max_model_len,
                                            kv_cache_dtype=args.kv_cache_dtype, block_size=args.block_size,
                                            max_num_batched_tokens=args.max_num_batched_tokens,
                                            gpu_memory_utilization=args.gpu_memory_utilization)
            step_note += f"; {num_blocks} KV blocks from the memory model"
    config = SchedulerConfig(
        num_blocks=num_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        enable_prefix_caching=not args.no_prefix_caching, policy=args.policy, reservation=args.reservation,
    )
    requests, truncation = synthetic_workload_with_truncation(
        args.requests, arrival_rate_per_s=args.rate, lengths=args.lengths, max_model_len=args.max_model_len,
        shared_prefix_tokens=args.shared_prefix_tokens, seed=args.seed,
    )
    result = simulate(requests, config, step_model)
    if args.json:
        data = json.loads(result.to_json(include_steps=args.steps))
        data["truncation"] = truncation.to_dict()
        data["step_model"] = step_note
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
    print(step_note)
    return 0
