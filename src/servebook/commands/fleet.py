"""``servebook fleet``: plan a large batch job (replicas, batch, hours, GPU-hours, cost).

    servebook fleet --config PATH --gpu NAME --gpus N [--tp N] --requests R
                    --input-tokens MEAN [--input-cv CV] --output-tokens MEAN [--output-cv CV]
                    [--batch B] [--max-num-seqs S] [--max-num-batched-tokens T] [--kv-cache-dtype fp8]
                    [--spec-k K --spec-alpha A [--draft-config PATH]] [--price-per-gpu-hour P] [--json]
    servebook fleet --compare-draft [--gpu NAME] [--json]     # the chapter draft's 6.22 table vs ours

Lengths are lognormal with the given mean and coefficient of variation (0 =
every request the same length).
"""
from __future__ import annotations

import json

from servebook.errors import ServebookError
from servebook.plan import USAGE_CONTEXT_FLAGS
from servebook.vllm_rules import (DEFAULT_GPU_MEMORY_UTILIZATION, GPU_LAB_VLLM, PINNED_VLLM, RULE_RELEASES,
                                  check_tp_size)


def register(sub) -> None:
    p = sub.add_parser("fleet", help="plan a batch job: replicas, batch, hours, GPU-hours, cost",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--compare-draft", action="store_true",
                   help="print the draft chapter's five 6.22 scenarios next to ours")
    p.add_argument("--config", help="config.json path, model directory or reference id")
    p.add_argument("--gpu", help="GPU name from the catalogue (default for --compare-draft: h100-sxm)")
    p.add_argument("--gpus", type=int, help="GPUs in the fleet")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size of one replica")
    p.add_argument("--requests", type=int, help="requests in the job")
    p.add_argument("--input-tokens", type=float, help="mean prompt length, tokens")
    p.add_argument("--input-cv", type=float, default=0.0, help="prompt length std/mean (lognormal)")
    p.add_argument("--output-tokens", type=float, help="mean output length, tokens")
    p.add_argument("--output-cv", type=float, default=0.0, help="output length std/mean (lognormal)")
    p.add_argument("--batch", type=int, help="decode batch per replica (default: what the KV cache holds)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="default: vLLM's for the usage context and GPU (servebook plan's rule)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="default: vLLM's for the usage context and GPU (servebook plan's rule)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="default: the model's context, lowered to what the KV cache holds (a note says so)")
    p.add_argument("--usage-context", choices=tuple(USAGE_CONTEXT_FLAGS), default="offline",
                   help="which of vLLM's batch defaults apply: offline (the LLM class, a batch job; default) "
                        "or serve (vllm serve)")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION,
                   help=f"fraction of GPU memory vLLM may use, in (0, 1] (default {DEFAULT_GPU_MEMORY_UTILIZATION}, vLLM's)")
    p.add_argument("--spec-k", type=int, default=0, help="speculative drafts per step")
    p.add_argument("--spec-alpha", type=float, help="per-token draft acceptance (0-1)")
    p.add_argument("--draft-config", help="draft model config.json (omit for n-gram drafting, no GPU cost)")
    p.add_argument("--price-per-gpu-hour", type=float, default=None,
                   help="currency units per GPU-hour (no cost line without it)")
    p.add_argument("--cudagraph-max-tokens", type=int,
                   help="largest step captured as a CUDA graph (default: vLLM's, at most 512 tokens)")
    p.add_argument("--calibration", help="calibration record to use instead of the shipped one")
    p.add_argument("--finite-job", action="store_true",
                   help="(the default now) the ramp and the drain of the job, replayed in the scheduler "
                        "simulator (servebook.simulator.finite_job); kept as an alias")
    p.add_argument("--steady-state", action="store_true",
                   help="only the steady state (no replay of the ramp and the drain)")
    p.add_argument("--vllm-version", default=None,
                   help=f"vLLM release whose rules apply where releases differ: one of {', '.join(RULE_RELEASES)} "
                        f"(default {PINNED_VLLM}, the newest checked; {GPU_LAB_VLLM} is the GPU results' release)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _need(args, *names):
    missing = [n for n in names if getattr(args, n.replace("-", "_")) is None]
    if missing:
        raise ServebookError("servebook fleet needs " + ", ".join(f"--{m}" for m in missing)
                             + " (or --compare-draft)")


#: (option, smallest allowed value, what it is) for the numeric options of a fleet plan; None values are unset.
_AT_LEAST = (
    ("gpus", 1, "GPUs in the fleet"),
    ("requests", 1, "requests in the job"),
    ("input-tokens", 1, "mean prompt length in tokens"),
    ("output-tokens", 1, "mean output length in tokens"),
    ("input-cv", 0, "coefficient of variation (0 = fixed lengths)"),
    ("output-cv", 0, "coefficient of variation (0 = fixed lengths)"),
    ("batch", 1, "sequences per replica (omit it to take what the KV cache holds)"),
    ("max-num-seqs", 1, "sequences per replica"),
    ("max-num-batched-tokens", 1, "tokens per engine step"),
    ("spec-k", 0, "drafts per step (0 = no speculation)"),
    ("price-per-gpu-hour", 0, "price per GPU-hour (omit it for no cost line)"),
    ("cudagraph-max-tokens", 1, "largest CUDA-graph step in tokens"),
)


def check_numbers(args) -> None:
    """Refuse a negative or zero option where it makes no sense, naming the option and its lower bound."""
    check_tp_size(args.tp)
    for name, low, what in _AT_LEAST:
        value = getattr(args, name.replace("-", "_"))
        if value is not None and value < low:
            raise ServebookError(f"--{name} {value:g} is not allowed: it is the {what} and must be >= {low}")


def run(args) -> int:
    from servebook.validation import validate_fleet_args

    validate_fleet_args(args)  # every flag, before any work
    from servebook.hf_config import load_model_spec
    from servebook.draft.fleet import compare_with_draft
    from servebook.perf.fleet import Deployment, LengthDistribution, Speculation, Workload, plan
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients
    from servebook.perf.speculative import Drafter

    if args.compare_draft:
        gpu = gpu_numbers(args.gpu or "h100-sxm")
        coeffs, where = calibrated_coefficients(gpu.name, args.calibration)
        rows = compare_with_draft(coeffs, gpu)
        if args.json:
            print(json.dumps({"gpu": gpu.name, "calibration": where, "rows": rows}))
            return 0
        print(f"{'scenario':36s}{'draft h':>9s}{'ours h':>9s}{'draft req/s':>12s}{'ours req/s':>11s}")
        for r in rows:
            print(f"{r['scenario']:36s}{r['draft']['hours']:9.1f}{r['ours']['hours']:9.1f}"
                  f"{r['draft']['requests_per_s']:12.1f}{r['ours']['requests_per_s']:11.1f}")
            print(f"    {r['why']}")
        print(f"note: {where}")
        return 0
    _need(args, "config", "gpu", "gpus", "requests", "input-tokens", "output-tokens")
    check_numbers(args)
    spec = load_model_spec(args.config)
    gpu = gpu_numbers(args.gpu)
    coeffs, where = calibrated_coefficients(gpu.name, args.calibration)
    speculation = None
    if args.spec_k:
        if args.spec_alpha is None:
            raise ServebookError("--spec-k needs --spec-alpha (per-token acceptance, 0-1)")
        drafter = Drafter("draft_model", load_model_spec(args.draft_config)) if args.draft_config else Drafter()
        speculation = Speculation(args.spec_k, args.spec_alpha, drafter)

    def lengths(mean, cv):
        return LengthDistribution.lognormal(mean, cv) if cv else LengthDistribution.fixed(int(round(mean)))

    work = Workload(args.requests, lengths(args.input_tokens, args.input_cv), lengths(args.output_tokens, args.output_cv))
    d = Deployment.of(spec, gpu=gpu, gpus=args.gpus, tp=args.tp, batch=args.batch, max_num_seqs=args.max_num_seqs,
                      max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                      kv_cache_dtype=args.kv_cache_dtype, gpu_memory_utilization=args.gpu_memory_utilization,
                      speculation=speculation, price_per_gpu_hour=args.price_per_gpu_hour,
                      cudagraph_max_tokens=args.cudagraph_max_tokens, usage_context=args.usage_context,
                      vllm_version=args.vllm_version)
    p = plan(work, d, coeffs)
    out = p.to_dict()
    out["gpu"] = gpu.name
    out["calibration"] = where
    out["engine"] = {"usage_context": d.plan.usage_context, "max_num_seqs": d.max_num_seqs,
                     "max_num_batched_tokens": d.max_num_batched_tokens, "max_model_len": d.plan.max_model_len,
                     "kv_blocks": d.plan.usable_blocks}
    finite = None
    if args.finite_job and args.steady_state:
        raise ServebookError("--finite-job and --steady-state contradict each other; give one")
    if speculation is None and not args.steady_state:
        from servebook.simulator.finite_job import finite_job_seconds

        finite = out["finite_job"] = finite_job_seconds(work, d, coeffs, p)
    elif args.finite_job:
        raise ServebookError("--finite-job replays the job without speculative decoding; drop --spec-k or --finite-job")
    from servebook.perf.error_bands import Query, assess

    job_s = finite["seconds"] if finite else p.hours * 3600
    band = assess(Query("job" if finite else "steady_state", spec, gpu.name, tp=args.tp,
                        context_tokens=args.input_tokens + args.output_tokens, kv_cache_dtype=d.plan.kv_cache_dtype,
                        speculative=speculation is not None))
    out["error_band"] = _band_json(band, job_s, finite["output_tokens_per_s"] if finite else p.output_tokens_per_s)
    if args.json:
        print(json.dumps(out))
        return 0
    _print_text(spec, gpu, p, finite, d, where, band)
    return 0


def _band_json(band: dict, seconds: float, tokens_per_s: float) -> dict:
    """The headline's band for JSON: :func:`servebook.perf.error_bands.assess` with the ranges it implies."""
    from servebook.perf.error_bands import scaled

    return band | {"of": "the job's wall time and output tokens/s", "wall_s_range": scaled(seconds, band["band"]),
                   "output_tokens_per_s_range": scaled(tokens_per_s, band["band"], rate=True)}


def _print_band(band, job_s, band_text, scaled) -> None:
    r = scaled(job_s, band["band"])
    print("    " + band_text(band, "jobs") + (f": {_hours(r[0])} to {_hours(r[1])}" if r and not band["outside"] else ""))


def _limit(p, d) -> str:
    """What limits the steady state's batch, in the words of the flag that would change it."""
    if p.bound != "decode":
        return "the prefill token budget (--max-num-batched-tokens)"
    if d.batch is not None:
        return "--batch"
    if p.batch == p.batch_kv_bound:
        return "the KV cache"
    return "--max-num-seqs"


def _hours(seconds: float) -> str:
    """A duration a reader can read: hours from 6 minutes up, else seconds with 3 significant digits."""
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds:.3g} s"


def _print_text(spec, gpu, p, finite, d, where, band) -> None:
    from servebook.perf.error_bands import band_text, scaled

    print(f"{spec.name} on {p.gpus} x {gpu.name} = {p.replicas} replicas of tp={p.tp}")
    steady_s = p.hours * 3600
    if finite:
        job_s = finite["seconds"]
        print(f"  the job: {_hours(job_s)} wall, {job_s * p.gpus / 3600:.3g} GPU-hours, "
              f"{finite['output_tokens_per_s']:.0f} output tokens/s "
              f"(steady state {_hours(steady_s)} + ramp and drain {_hours(finite['ramp_drain_s'])}; "
              f"peak {finite['peak_running']} running per replica in the replay)")
        _print_band(band, job_s, band_text, scaled)
        share = finite["ramp_drain_s"] / job_s if job_s else 0.0
        print("  " + ("the steady state alone is a fair answer (ramp and drain under 5%)" if share < 0.05 else
                      f"ramp and drain are {share:.0%} of the job: the steady state alone would be too optimistic"))
    else:
        job_s = steady_s
        print(f"  steady state only: {_hours(steady_s)} wall, {p.gpu_hours:.3g} GPU-hours, "
              f"{p.output_tokens_per_s:.0f} output tokens/s (no ramp or drain)")
        _print_band(band, job_s, band_text, scaled)
    print(f"  batch {p.batch} per replica, limited by {_limit(p, d)} (KV cache holds {p.batch_kv_bound}); "
          f"{p.tokens_per_step:.2f} tokens/step, mean step {p.step_s * 1e3:.1f} ms")
    per_replica = p.requests_per_s * p.hours * 3600 / p.replicas if p.hours else 0.0
    if per_replica and per_replica < p.batch:
        print(f"  the job has {per_replica:.0f} requests per replica: it never fills that batch (the replay above "
              "counts what runs)")
    larger = "prefill" if p.prefill_hours > p.decode_hours else "decode"
    print(f"  steady-state time: {_hours(p.prefill_hours * 3600)} prefill + {_hours(p.decode_hours * 3600)} decode "
          f"({larger} takes more)")
    if d.price_per_gpu_hour is not None:
        print(f"  cost: {job_s * p.gpus / 3600 * d.price_per_gpu_hour:,.2f} at {d.price_per_gpu_hour:g} per GPU-hour")
    for n in p.notes + (where,):
        print(f"  note: {n}")
