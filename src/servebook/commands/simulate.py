"""``servebook simulate``: run the scheduler simulator on a synthetic workload."""
from __future__ import annotations

import json
import math

from servebook.errors import ServebookError
from servebook.vllm_rules import (DEFAULT_GPU_MEMORY_UTILIZATION, GPU_LAB_VLLM, PINNED_VLLM, RULE_RELEASES,
                                  check_tp_size)
from servebook.simulator import (LENGTH_PRESETS, POLICIES, RESERVATIONS, LinearStepTime, SchedulerConfig, simulate,
                                 synthetic_workload_with_truncation)
from servebook.simulator.config import TOY_MAX_MODEL_LEN, scheduler_config
from servebook.simulator.step_time import PerfStepTime, perf_step_time_for
from servebook.simulator.workload import lognormal_lengths
from servebook.plan import USAGE_CONTEXT_FLAGS

#: KV blocks of the toy engine (no model, no GPU to size a pool from).
TOY_NUM_BLOCKS = 4096


def register(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate vLLM's scheduler (paged KV, continuous batching) or a baseline policy",
        description="Discrete-event simulation of a vLLM 0.32.0-like step loop (--vllm-version 0.26.0 for that release) on a synthetic "
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
    p.add_argument("--lengths", choices=sorted(LENGTH_PRESETS), default=None,
                   help="prompt/output length distribution preset (default sharegpt-like; or give "
                        "--input-tokens/--output-tokens, as servebook fleet takes them)")
    p.add_argument("--input-tokens", type=float, help="mean prompt length, tokens (lognormal; with --output-tokens)")
    p.add_argument("--input-cv", type=float, default=0.0, help="prompt length std/mean (0 = fixed lengths)")
    p.add_argument("--output-tokens", type=float, help="mean output length, tokens (lognormal; with --input-tokens)")
    p.add_argument("--output-cv", type=float, default=0.0, help="output length std/mean (0 = fixed lengths)")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="usable KV blocks (default: with --config, the deployment's pool from servebook plan, "
                   f"its KV groups included; otherwise {TOY_NUM_BLOCKS})")
    p.add_argument("--block-size", type=int, default=None,
                   help="tokens per KV block (default: vLLM's, 16 on CUDA)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="default: vLLM's for the usage context and GPU with --config (as servebook plan); "
                        "otherwise the toy engine's")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="default: vLLM's for the usage context and GPU with --config; otherwise the toy engine's")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="default: with --config the model's context (vLLM's default, as servebook plan); "
                        f"otherwise the toy engine's {TOY_MAX_MODEL_LEN} tokens")
    p.add_argument("--usage-context", choices=tuple(USAGE_CONTEXT_FLAGS), default="serve",
                   help="with --config: which of vLLM's batch defaults apply (serve = vllm serve, "
                        "offline = the LLM class)")
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
    p.add_argument("--vllm-version", default=None,
                   help=f"vLLM release whose rules apply where releases differ: one of {', '.join(RULE_RELEASES)} "
                        f"(default {PINNED_VLLM}, the newest checked; {GPU_LAB_VLLM} is the GPU results' release)")
    p.add_argument("--json", action="store_true", help="print JSON (summary and config)")
    p.add_argument("--steps", action="store_true", help="with --json: include the per-step trace and per-request metrics")
    p.set_defaults(func=run)


def _plan(args):
    """The deployment servebook plan sizes for these arguments (with --config), else None."""
    if not args.config or (args.step_model or "perf") != "perf" or not args.gpu:
        return None
    from servebook.plan import make_plan

    return make_plan(args.config, gpu=args.gpu, tp=args.tp, max_model_len=args.max_model_len,
                     kv_cache_dtype=args.kv_cache_dtype, block_size=args.block_size,
                     max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                     gpu_memory_utilization=args.gpu_memory_utilization, usage_context=args.usage_context,
                     vllm_version=args.vllm_version)


def _step_model(args, plan=None):
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
                                     max_num_seqs=plan.max_num_seqs,
                                     max_num_batched_tokens=plan.max_num_batched_tokens,
                                     calibration=args.calibration)
    return step, (f"step times: performance model for {step.spec.name} on {step.coeffs.gpu or args.gpu}, "
                  f"TP {args.tp} ({where})")


def _lengths(args):
    """The length distribution: a preset, or lognormal lengths from fleet's flags."""
    given = [f for f, v in (("--input-tokens", args.input_tokens), ("--output-tokens", args.output_tokens)) if v is not None]
    if not given:
        return args.lengths or "sharegpt-like"
    if args.lengths:
        raise ServebookError("--lengths is a preset; give either it or --input-tokens/--output-tokens, not both")
    if len(given) == 1:
        raise ServebookError("--input-tokens and --output-tokens go together (means in tokens; add the missing one)")
    return lognormal_lengths(args.input_tokens, args.input_cv, args.output_tokens, args.output_cv)


def run(args) -> int:
    from servebook.validation import validate_simulate_args

    validate_simulate_args(args)  # every flag, before any work
    plan = _plan(args)
    step_model, step_note = _step_model(args, plan)
    # the deployment's context (the model's, as servebook plan and vllm serve default to), else the toy engine's
    max_model_len = plan.max_model_len if plan is not None else (args.max_model_len or TOY_MAX_MODEL_LEN)
    policy_fields = dict(long_prefill_token_threshold=args.long_prefill_token_threshold,
                         enable_prefix_caching=not args.no_prefix_caching, policy=args.policy,
                         reservation=args.reservation, vllm_version=args.vllm_version or PINNED_VLLM)
    engine = {k: v for k, v in (("block_size", args.block_size), ("max_num_seqs", args.max_num_seqs),
                                ("max_num_batched_tokens", args.max_num_batched_tokens)) if v is not None}
    if isinstance(step_model, PerfStepTime):
        # the deployment's engine, as servebook plan sizes it: one answer for its pool and limits
        overrides = dict(policy_fields)
        if args.num_blocks is not None:
            overrides["num_blocks"] = args.num_blocks
        full, sliding = plan.pool_groups()
        windows = [w for w, _ in sliding]
        if args.policy != "paged":   # contiguous reservations know no groups
            overrides.update(full_groups=1, sliding_windows=(), full_block_sizes=(), sliding_block_sizes=())
        config = scheduler_config(plan, **overrides)
        step_note += (f"; {config.num_blocks} KV blocks" + (" given" if args.num_blocks is not None else
                      f" from servebook plan ({len(windows)} sliding-window groups, prefix caching not simulated)"
                      if windows and args.policy == "paged" else " from servebook plan"))
    else:
        config = SchedulerConfig(num_blocks=args.num_blocks or TOY_NUM_BLOCKS, max_model_len=max_model_len,
                                 **engine, **policy_fields)
    requests, truncation = synthetic_workload_with_truncation(
        args.requests, arrival_rate_per_s=args.rate, lengths=_lengths(args), max_model_len=max_model_len,
        shared_prefix_tokens=args.shared_prefix_tokens, seed=args.seed,
    )
    result = simulate(requests, config, step_model)
    s = result.summary()
    band = _band(args, plan, step_model, requests, s) if isinstance(step_model, PerfStepTime) else None
    served = _served(args, result) if isinstance(step_model, PerfStepTime) and math.isfinite(args.rate) else None
    if args.json:
        data = json.loads(result.to_json(include_steps=args.steps))
        data["truncation"] = truncation.to_dict()
        data["step_model"] = step_note
        if band is not None:
            data["error_band"] = band
        if served is not None:
            data["served"] = served
        print(json.dumps(data, indent=2))
        return 0
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
        ("KV holding tokens", "not reported for sliding-window groups" if s["kv_utilisation"] is None
         else f"{s['kv_utilisation'] * 100:.1f}% of reserved KV memory (time-weighted)"),
        ("mean running", f"{s['mean_running']:.1f} sequences (peak {s['peak_running']})"),
    ]
    if truncation.requests:
        rows.insert(2, ("truncated", truncation.describe(len(requests))))
    if band is not None:
        from servebook.perf.error_bands import band_text

        r = band["makespan_s_range"]
        rows.insert(rows.index(next(x for x in rows if x[0] == "throughput")) + 1,
                    ("  makespan band", band_text(band, "jobs") + (f": {r[0]:.2f} to {r[1]:.2f} s"
                                                                   if r and not band["outside"] else "")))
        if served is None:
            rows.append(("TTFT, latency", "no held-out band: the bands cover the makespan and throughput only"))
    if served is not None:
        rows += _served_rows(served, args.gpu)
    for key, value in rows:
        print(f"{key:18s}{value}")
    print(step_note)
    return 0


def _served(args, result) -> dict:
    """The run as ``vllm bench serve`` reports it (what ``servebook tune`` predicts): the measured
    serving path added, p50/p90/p99 TTFT and TPOT, and the held-out band of the ``vllm serve`` runs."""
    from servebook.simulator.online import latency_band, measured_serving_path, served_latency

    path = measured_serving_path(args.gpu)
    return served_latency(result, serving_path=path).to_dict() | {"error_band": latency_band(args.gpu)}


def _served_rows(served: dict, served_gpu: str) -> list[tuple[str, str]]:
    from servebook.simulator.online import latency_band_text

    path = served["serving_path"]
    rows = [("as served", f"TTFT p50 {served['ttft_p50_s'] * 1e3:,.0f} ms, p90 {served['ttft_p90_s'] * 1e3:,.0f} ms; "
                          f"TPOT p50 {served['tpot_p50_s'] * 1e3:.1f} ms, p90 {served['tpot_p90_s'] * 1e3:.1f} ms "
                          f"(vllm bench serve's definitions; the engine's figures above plus the API server's "
                          f"{path['ttft_s'] * 1e3:.1f} ms to the first token, as servebook tune predicts)")]
    rows.append(("  served band", latency_band_text(served["error_band"], served_gpu)))
    return rows


def _band(args, plan, step_model, requests, summary) -> dict:
    """The held-out band of the simulated makespan and throughput (servebook.perf.error_bands)."""
    from servebook.perf.error_bands import Query, assess, scaled
    from servebook.perf.gpu import gpu_numbers

    n = max(len(requests), 1)
    context = sum(r.prompt_tokens + r.output_tokens for r in requests) / n
    a = assess(Query("simulated", step_model.spec, gpu_numbers(args.gpu).name, tp=args.tp, context_tokens=context,
                     kv_cache_dtype=plan.kv_cache_dtype, open_arrivals=math.isfinite(args.rate)))
    return a | {"of": "makespan_s and output_tokens_per_s", "makespan_s_range": scaled(summary["makespan_s"], a["band"]),
                "output_tokens_per_s_range": scaled(summary["output_tokens_per_s"], a["band"], rate=True)}
