"""``servebook plan``: memory budget, KV capacity and recommended flags for one deployment.

::

    servebook plan --config PATH|ID [--gpu NAME] [--tp N] [--max-model-len N]
                   [--gpu-memory-utilization U] [--kv-cache-dtype auto|fp8]
                   [--block-size N] [--max-num-batched-tokens N]
                   [--available-kv-gib X] [--request-tokens N]
                   [--enable-lora [--max-loras N] [--max-lora-rank R] [--max-cpu-loras N]] [--json]

Argument parsing and the printed table only; the plan itself is
:func:`servebook.plan.make_plan` (its docstring gives the defaults and the
rule behind the recommended ``--max-num-seqs``).
"""
from __future__ import annotations

import json

from servebook.vllm_rules import GPU_LAB_VLLM, PINNED_VLLM, RULE_RELEASES
from servebook.errors import ServebookError
from servebook.memory import DEFAULT_GPU_MEMORY_UTILIZATION, load_coefficients
from servebook.plan import (  # noqa: F401  (re-exported for callers of the old home)
    DEFAULT_GPU,
    KV_CACHE_DTYPES,
    FIGURES_NOTE,
    MAX_NUM_SEQS_FRACTION,
    WATCH_METRICS,
    USAGE_CONTEXT_FLAGS,
    Plan,
    make_plan,
    recommended_max_num_seqs,
)


def _known_gpus() -> str:
    try:
        from servebook.hardware import gpu_names

        return ", ".join(gpu_names())
    except Exception:  # pragma: no cover - help text only
        return "see servebook/data/gpus.toml"


def _description() -> str:
    try:
        status = load_coefficients().summary
    except ServebookError:  # pragma: no cover - a broken data file is reported when planning
        status = "unreadable"
    return (
        "Memory budget, KV cache capacity and recommended vLLM flags for one deployment "
        f"(vLLM {PINNED_VLLM} rules; activation, non-torch and CUDA-graph coefficients {status})."
    )


def register(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="memory budget, KV cache capacity and recommended vLLM flags for one deployment",
        description=_description(),
    )
    p.add_argument("--config", required=True, help="config.json path, model directory, or reference id (e.g. llama-3.1-8b)")
    p.add_argument("--gpu", default=None, help=f"GPU name from the catalogue: {_known_gpus()} (default {DEFAULT_GPU})")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    p.add_argument("--max-model-len", type=int, default=None, help="context length in tokens (default: the model's max_position_embeddings)")
    p.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION,
                   help=f"fraction of GPU memory vLLM may use, in (0, 1] (default {DEFAULT_GPU_MEMORY_UTILIZATION})")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES, help="KV cache dtype (default auto = model dtype)")
    p.add_argument("--block-size", type=int, default=None, help="tokens per KV block, a multiple of 16 (default 16 on CUDA)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="tokens per engine step (default: vLLM's for the GPU)")
    p.add_argument("--available-kv-gib", type=float, default=None,
                   help="start from a logged 'Available KV cache memory' (GiB per GPU) instead of the budget")
    p.add_argument("--request-tokens", type=int, default=None,
                   help="prompt + output tokens per request for the run-time concurrency and the recommended "
                        "--max-num-seqs (default: --max-model-len)")
    p.add_argument("--prompt-tokens", type=int, default=None,
                   help="prompt tokens of those requests, which admission must find free blocks for "
                        "(default: all of --request-tokens)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="the engine's --max-num-seqs (default: vLLM's for the usage context and GPU)")
    p.add_argument("--usage-context", choices=tuple(USAGE_CONTEXT_FLAGS), default="serve",
                   help="which of vLLM's batch defaults apply: serve (vllm serve; default) or offline (the LLM class)")
    p.add_argument("--enable-lora", action="store_true",
                   help="serve LoRA adapters: their GPU slots join the weights claim and the serve line")
    p.add_argument("--max-loras", type=int, default=None,
                   help="adapters one batch may mix, one GPU slot each (vLLM's default 1; needs --enable-lora)")
    p.add_argument("--max-lora-rank", type=int, default=None,
                   help="largest adapter rank: 1, 8, 16, 32, 64, 128, 256, 320 or 512 (vLLM's default 16)")
    p.add_argument("--max-cpu-loras", type=int, default=None,
                   help="adapters cached in host memory, at least --max-loras (vLLM's default: --max-loras)")
    p.add_argument("--vllm-version", default=None,
                   help=f"vLLM release whose rules apply where releases differ: one of {', '.join(RULE_RELEASES)} "
                        f"(default {PINNED_VLLM}, the newest checked; {GPU_LAB_VLLM} is the GPU results' release)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _table(plan: Plan) -> str:
    d = plan.to_dict()
    cap = plan.capacity
    b = plan.budget
    lines = [f"servebook plan: {plan.spec.name}, TP={plan.tp}, max_model_len={plan.max_model_len:,} (vLLM {plan.vllm_version} rules)"]
    lines.append("")
    if b is not None:
        lines.append(f"Memory budget per GPU ({plan.gpu_name}; activation, non-torch and CUDA-graph")
        lines.append(f"  coefficients {plan.coefficients_summary})")
        lines.append(f"  {'GPU memory x utilization':28s}{b.total_memory_gib:10.2f} GiB x {b.gpu_memory_utilization:g} = {b.requested_gib:.2f} GiB")
        lines.append(f"  {'- weights':28s}{b.weights_gib:10.2f} GiB")
        if plan.lora is not None:
            lines.append(f"  {'- LoRA slots':28s}{b.lora_gib:10.2f} GiB ({plan.lora.max_loras} x rank "
                         f"{plan.lora.max_lora_rank}, every linear layer, embedding and LM head)")
        lines.append(f"  {'- peak activation':28s}{b.activation_gib:10.2f} GiB")
        prior = " (prior guess: no TP>1 start-up recorded)" if plan.tp > 1 and load_coefficients().tp_gt1_non_torch_is_prior else ""
        lines.append(f"  {'- non-torch':28s}{b.non_torch_gib:10.2f} GiB{prior}")
        lines.append(f"  {'- CUDA graphs':28s}{b.cudagraph_gib:10.2f} GiB")
        lines.append(f"  {'= available KV cache':28s}{b.available_kv_gib:10.2f} GiB")
    else:
        lines.append("Memory budget per GPU: taken from the log (--available-kv-gib)")
        lines.append(f"  {'weights (from the config)':28s}{d['weights_gib']:10.2f} GiB")
        lines.append(f"  {'available KV cache':28s}{d['available_kv_gib']:10.2f} GiB")
    if plan.kernel is not None:
        lines.append(f"  weights quantized ({d['quantization']}): {plan.gpu_name} runs {plan.kernel.kernel}"
                     + (f"; {plan.kernel.note}" if plan.kernel.note else ""))
    lines.append("")
    lines.append("KV cache (per GPU)")
    lines.append(f"  {'bytes per token':28s}{cap.layout.kv_bytes_per_token:>10,} B (all layers, full context)")
    lines.append(f"  {'block size':28s}{cap.block_size:>10} tokens; {len(cap.layout.groups)} group(s) of {cap.layout.group_size} layer(s)")
    if cap.padding_layers:
        lines.append(f"  {'padding layers':28s}{cap.padding_layers:>10} (may waste at most {cap.padding_waste_pct:.2f}%)")
    lines.append(f"  {'GPU blocks':28s}{cap.num_gpu_blocks:>10,}")
    lines.append(f"  {'GPU KV cache size':28s}{cap.kv_cache_tokens:>10,} tokens")
    lines.append(f"  {'admission ceiling (logged)':28s}{cap.max_concurrency:>10.2f}x requests of {plan.max_model_len:,} tokens")
    lines.append(f"  {'running at once':28s}{plan.running.max_running:>10,} requests of {plan.request_tokens:,} tokens "
                 f"({plan.running.blocks_per_request:,} blocks each)")
    lines.append(f"  ({FIGURES_NOTE})")
    lines.append("")
    lines.append("Recommended")
    if plan.max_num_seqs == plan.default_max_num_seqs:
        ceiling = f"vLLM's default {plan.max_num_seqs}"
    elif plan.max_num_seqs == plan.max_num_batched_tokens:
        ceiling = f"the token budget {plan.max_num_seqs}: vLLM needs max_num_batched_tokens >= max_num_seqs"
    else:
        ceiling = f"--max-num-seqs {plan.max_num_seqs}"
    lines.append(f"  --max-num-seqs {plan.recommended_max_num_seqs} ({MAX_NUM_SEQS_FRACTION:.0%} of the requests running at "
                 f"once, at most {ceiling}); vLLM admits on free blocks and preempts at "
                 f"the limit: watch {' and '.join(WATCH_METRICS)}")
    lines.append(f"  {plan.serve_command()}")
    return "\n".join(lines)


def lora_settings(args):
    """The LoRA flags as :class:`servebook.lora.LoraSettings`, None without ``--enable-lora``."""
    if not getattr(args, "enable_lora", False):
        return None
    from servebook.lora import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS, LoraSettings

    return LoraSettings(
        max_loras=DEFAULT_MAX_LORAS if args.max_loras is None else args.max_loras,
        max_lora_rank=DEFAULT_MAX_LORA_RANK if args.max_lora_rank is None else args.max_lora_rank,
        max_cpu_loras=args.max_cpu_loras,
    )


def run(args) -> int:
    from servebook.validation import validate_plan_args

    validate_plan_args(args)  # every flag, before any work
    plan = make_plan(
        args.config,
        gpu=args.gpu,
        tp=args.tp,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_dtype=args.kv_cache_dtype,
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        usage_context=args.usage_context,
        prompt_tokens=args.prompt_tokens,
        available_kv_gib=args.available_kv_gib,
        request_tokens=args.request_tokens,
        lora=lora_settings(args),
        vllm_version=args.vllm_version,
    )
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(_table(plan))
    return 0
