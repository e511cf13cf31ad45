"""One home for the input checks every front door shares (CLI commands and the live pages).

A mistake gets the same message wherever it is made: the message names the option (``--tp``
on the command line, ``tp`` on a live page: the caller passes ``name``), says what the value is
for, and what to use instead. Every check raises :class:`servebook.errors.ServebookError` (or a
subclass); the CLI prints it without a traceback and exits 2, a live page shows it.

The checks here run *before any work*: they look at one value, or at a few values together
(``--max-num-batched-tokens`` and ``--max-num-seqs``, ``--batch`` and ``--max-num-seqs``), and
read a file only to refuse it early (``--calibration``). A model's shape is checked where the
model is read (``servebook.hf_config``, ``servebook.vllm_rules.check_tp``); ``simulate`` reads
its ``--config`` here, because the simulator would otherwise draw the workload first.
``validate_<command>_args(args)`` runs every check a command's flags need; each command calls its
own once, at the top of ``run``. The live pages call the single-value checks with their field names.

Units: ``*_gib`` GiB (2**30 bytes), ``*_tokens`` tokens, seeds are integers in [0, 2**32).
"""
from __future__ import annotations

import math
from numbers import Real

from servebook.errors import ServebookError, UnknownGPUError
from servebook.vllm_rules import (
    BLOCK_SIZE_MULTIPLE,
    KV_DTYPE_BYTES,
    MAX_BLOCK_SIZE,
    check_batch_budget,
    check_block_size,
    check_long_prefill_threshold,
    rule_release,
)

#: Seeds accepted: [0, 2**32). ``numpy.random.seed`` (which vLLM's ``seed`` reaches) refuses others;
#: the simulator's generator refuses negative ones.
SEED_LIMIT = 2**32
GIB = 2**30


def _shown(value) -> str:
    """A value as a message shows it: numbers plainly (``1e+09``, ``0``), text quoted."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:g}"


def _refuse(name: str, value, what: str, rule: str) -> ServebookError:
    return ServebookError(f"{name} {_shown(value)} is not allowed: it is the {what} and must be {rule}")


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


# -- single values --------------------------------------------------------------------------------

def check_int(value, name: str, what: str, *, low: int = 1, high: int | None = None, hint: str = "") -> None:
    """Raise unless ``value`` is None or a whole number in ``[low, high]``."""
    if value is None:
        return
    if not _is_number(value) or not math.isfinite(value) or value != int(value):
        raise ServebookError(f"{name} {_shown(value)} is not a whole number; it is the {what}{hint}")
    if value < low:
        raise _refuse(name, value, what, f">= {low}{hint}")
    if high is not None and value > high:
        raise _refuse(name, value, what, f"<= {high}{hint}")


def check_number(value, name: str, what: str, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, hint: str = "") -> None:
    """Raise unless ``value`` is None or a finite number in the range (``low`` excluded when ``low_open``).

    NaN and infinity are refused by name: ``float()`` accepts "nan" and "inf", a calculator cannot.
    """
    if value is None:
        return
    if not _is_number(value) or not math.isfinite(value):
        raise _refuse(name, value, what, f"a finite number{hint}")
    if low is not None and (value <= low if low_open else value < low):
        raise _refuse(name, value, what, f"{'>' if low_open else '>='} {low:g}{hint}")
    if high is not None and value > high:
        raise _refuse(name, value, what, f"<= {high:g}{hint}")


def check_fraction(value, name: str, what: str, *, zero_allowed: bool = False, hint: str = "") -> None:
    """Raise unless ``value`` is None or a fraction: in (0, 1], or [0, 1] when ``zero_allowed``."""
    if value is None:
        return
    span = "[0, 1]" if zero_allowed else "(0, 1]"
    if not _is_number(value) or not math.isfinite(value) or value > 1 or value < 0 or (value == 0 and not zero_allowed):
        raise _refuse(name, value, what, f"a fraction in {span}{hint}")


def check_utilization_arg(value, name: str = "--gpu-memory-utilization") -> None:
    """``gpu_memory_utilization``: a fraction in (0, 1] (vLLM's ``CacheConfig`` range)."""
    check_fraction(value, name, "fraction of GPU memory vLLM may use", hint=", e.g. 0.92")


def check_seed(value, name: str = "--seed") -> None:
    """A random seed: a whole number in [0, 2**32) (what numpy's generators accept)."""
    check_int(value, name, "random seed", low=0, high=SEED_LIMIT - 1)


def check_tp_arg(value, name: str = "--tp") -> None:
    """A tensor-parallel size: a whole number of GPUs >= 1 (whether it splits the heads needs the model).

    The wording is :func:`servebook.vllm_rules.check_tp_size`'s, which the library raises for ``--tp``.
    """
    check_int(value, name, "tensor-parallel size")


def known_gpus() -> str:
    from servebook.hardware import gpu_names

    return ", ".join(gpu_names())


def check_gpu(value, name: str = "--gpu", *, required: bool = False):
    """The catalogue entry for a GPU name; None when the name is None and not ``required``.

    An empty name is refused (it used to mean the default GPU silently); an unknown one gets the
    catalogue's message listing the known names.
    """
    from servebook.hardware import get_gpu

    if value is None:
        if required:
            raise UnknownGPUError(f"{name} is required: give a GPU name from the catalogue ({known_gpus()}), "
                                  "e.g. h200")
        return None
    if not isinstance(value, str):
        raise UnknownGPUError(f"{name} {_shown(value)} is not a GPU name: give one from the catalogue "
                              f"({known_gpus()}), e.g. h200")
    if not value.strip():
        raise UnknownGPUError(f"{name} {_shown(value)} is empty: give a GPU name from the catalogue "
                              f"({known_gpus()}), e.g. h200")
    return get_gpu(value)


def check_kv_cache_dtype(value, name: str = "--kv-cache-dtype", allowed=None) -> None:
    """A KV cache dtype servebook knows (``allowed`` narrows the set for one calculator)."""
    choices = tuple(allowed or KV_DTYPE_BYTES)
    if value not in choices:
        raise ServebookError(f"{name} {_shown(value)} is not supported: it is the KV cache dtype and must be one "
                             f"of {', '.join(choices)} (auto = the model's dtype)")


def check_block_size_arg(value, name: str = "--block-size") -> None:
    """``--block-size`` (tokens): vLLM's rule, :func:`servebook.vllm_rules.check_block_size`, naming the option."""
    if value is None:
        return
    try:
        check_block_size(value)
    except ServebookError:
        raise _refuse(name, value, "number of tokens per KV block",
                      f"a multiple of {BLOCK_SIZE_MULTIPLE} between {BLOCK_SIZE_MULTIPLE} and {MAX_BLOCK_SIZE} "
                      "(vLLM's attention kernels; 16 is the CUDA default)") from None


def check_available_kv_gib(value, gpu, tp: int = 1, name: str = "--available-kv-gib") -> None:
    """A logged ``Available KV cache memory`` (GiB per GPU): finite, > 0, at most the GPU's memory.

    vLLM logs the figure per GPU (each TP rank holds its share of the KV cache), so it can never
    exceed one GPU's memory, whatever the TP size; a number above that is a typo, or the sum over
    the TP ranks.
    """
    if value is None:
        return
    check_number(value, name, "KV cache memory per GPU in GiB (the log's 'Available KV cache memory')",
                 low=0, low_open=True, hint="; use a positive number of GiB")
    if gpu is not None and value * GIB > gpu.memory_bytes:
        total = f"; {tp} GPUs together hold {tp * gpu.memory_gib:.2f} GiB but the log" if tp > 1 else "; the log"
        raise ServebookError(
            f"{name} {_shown(value)} GiB is more than the whole memory of one {gpu.name} "
            f"({gpu.memory_gib:.2f} GiB){total} gives the KV cache per GPU: "
            f"use the 'Available KV cache memory' figure of one GPU's log, at most {gpu.memory_gib:.2f} GiB")


def check_calibration(path, name: str = "--calibration") -> None:
    """Read the calibration record now, so a wrong file fails before any work (see ``load_calibration``)."""
    if path is None:
        return
    if not str(path).strip():
        raise ServebookError(f"{name} is empty; give a calibration record (.json) or omit {name} for the shipped one")
    from servebook.perf.model import load_calibration

    load_calibration(path)


def check_max_model_len(value, spec, name: str = "--max-model-len") -> None:
    """``max_model_len`` (tokens) at most the model's ``max_position_embeddings`` (vLLM refuses more).

    The wording is ``servebook plan``'s (:func:`servebook.plan.make_plan`), so the mistake reads alike.
    """
    limit = spec.max_position_embeddings
    if value is not None and limit and value > limit:
        raise ServebookError(f"{name} {value} exceeds the model's max_position_embeddings ({limit}); "
                             f"use a value in [1, {limit}]")


def check_config_arg(value, name: str = "--config") -> None:
    """An empty ``--config`` is refused before the model loader reads the current directory."""
    if value is not None and not str(value).strip():
        raise ServebookError(f"{name} is empty; give a reference id (e.g. llama-3.1-8b), a config.json or a model "
                             "directory")


# -- per command ----------------------------------------------------------------------------------

def check_vllm_version(value, name: str = "--vllm-version") -> None:
    """A release whose rules servebook holds (:data:`servebook.vllm_rules.RULE_RELEASES`), or None."""
    if value is not None:
        rule_release(value)


def validate_plan_args(args) -> None:
    """``servebook plan``'s flags, before the model is read."""
    check_vllm_version(getattr(args, "vllm_version", None))
    check_config_arg(args.config)
    gpu = check_gpu(args.gpu)
    check_tp_arg(args.tp)
    check_int(args.max_model_len, "--max-model-len", "context length in tokens")
    check_utilization_arg(args.gpu_memory_utilization)
    check_kv_cache_dtype(args.kv_cache_dtype, allowed=("auto", "fp8"))
    check_block_size_arg(args.block_size)
    check_int(args.max_num_batched_tokens, "--max-num-batched-tokens", "tokens per engine step")
    check_int(args.request_tokens, "--request-tokens", "prompt + output tokens per request",
              hint=" and at most --max-model-len")
    if args.available_kv_gib is not None:
        if gpu is None:
            from servebook.hardware import get_gpu
            from servebook.plan import DEFAULT_GPU

            gpu = get_gpu(DEFAULT_GPU)
        check_available_kv_gib(args.available_kv_gib, gpu, args.tp)
    check_lora_args(args)


def check_lora_args(args) -> None:
    """``--enable-lora`` and its sizes: the sizes only with it, each as vLLM 0.27.1 accepts it."""
    sizes = {f: getattr(args, f.replace("-", "_"), None) for f in ("max-loras", "max-lora-rank", "max-cpu-loras")}
    if not getattr(args, "enable_lora", False):
        given = [f"--{f}" for f, v in sizes.items() if v is not None]
        if given:
            raise ServebookError(f"{', '.join(given)} only apply to LoRA adapters; add --enable-lora (or drop them)")
        return
    from servebook.lora import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS, check_lora_settings

    loras = DEFAULT_MAX_LORAS if sizes["max-loras"] is None else sizes["max-loras"]
    rank = DEFAULT_MAX_LORA_RANK if sizes["max-lora-rank"] is None else sizes["max-lora-rank"]
    check_lora_settings(loras, rank, sizes["max-cpu-loras"])


#: (option, smallest allowed value, what it is) for fleet's whole-number options.
_FLEET_INTS = (
    ("gpus", 1, "GPUs in the fleet"),
    ("requests", 1, "requests in the job"),
    ("batch", 1, "sequences per replica (omit it to take what the KV cache holds)"),
    ("max-num-seqs", 1, "sequences per replica"),
    ("max-num-batched-tokens", 1, "tokens per engine step"),
    ("spec-k", 0, "drafts per step (0 = no speculation)"),
    ("cudagraph-max-tokens", 1, "largest CUDA-graph step in tokens"),
)
#: (option, smallest allowed value, what it is) for fleet's real-number options.
_FLEET_NUMBERS = (
    ("input-tokens", 1, "mean prompt length in tokens"),
    ("output-tokens", 1, "mean output length in tokens"),
    ("input-cv", 0, "coefficient of variation (0 = fixed lengths)"),
    ("output-cv", 0, "coefficient of variation (0 = fixed lengths)"),
    ("price-per-gpu-hour", 0, "price per GPU-hour (omit it for no cost line)"),
)


def _arg(args, option: str):
    return getattr(args, option.replace("-", "_"), None)


def _default_max_num_seqs(gpu_name, usage_context: str) -> int | None:
    """vLLM's default ``max_num_seqs`` for the usage context (``serve``/``offline``) on a catalogue GPU."""
    if not gpu_name:
        return None
    from servebook.hardware import get_gpu
    from servebook.plan import USAGE_CONTEXT_FLAGS
    from servebook.vllm_rules import vllm_batch_defaults

    gpu = get_gpu(gpu_name)
    return vllm_batch_defaults(int(gpu.memory_bytes), gpu.name, usage_context=USAGE_CONTEXT_FLAGS[usage_context])[1]


def check_engine_batch(max_num_batched_tokens, max_num_seqs, default_max_num_seqs) -> None:
    """vLLM's ``max_num_batched_tokens >= max_num_seqs``, where ``max_num_seqs`` may be left to vLLM's
    default: a token budget alone below that default is refused as vLLM refuses it."""
    if max_num_batched_tokens is None:
        return
    seqs = max_num_seqs if max_num_seqs is not None else default_max_num_seqs
    if seqs is not None:
        check_batch_budget(max_num_batched_tokens, seqs)


def validate_fleet_args(args) -> None:
    """``servebook fleet``'s flags, before the model is read."""
    if args.compare_draft:
        job = [f"--{o}" for o in ("config", "gpus", "requests", "input-tokens", "output-tokens", "batch",
                                  "spec-alpha", "draft-config", "cudagraph-max-tokens") if _arg(args, o) is not None]
        job += ["--spec-k"] if args.spec_k else []
        job += ["--finite-job"] if args.finite_job else []
        if job:
            raise ServebookError(f"--compare-draft prints the draft chapter's own five scenarios and ignores "
                                 f"{', '.join(job)}; drop --compare-draft to plan your job, or drop "
                                 f"{'those flags' if len(job) > 1 else 'it'}")
        check_gpu(args.gpu)
        check_calibration(args.calibration)
        return
    check_vllm_version(getattr(args, "vllm_version", None))
    check_config_arg(args.config)
    check_gpu(args.gpu)
    check_tp_arg(args.tp)
    for option, low, what in _FLEET_INTS:
        check_int(_arg(args, option), f"--{option}", what, low=low)
    for option, low, what in _FLEET_NUMBERS:
        check_number(_arg(args, option), f"--{option}", what, low=low)
    check_utilization_arg(args.gpu_memory_utilization)
    check_kv_cache_dtype(args.kv_cache_dtype)
    check_fraction(args.spec_alpha, "--spec-alpha", "per-token draft acceptance", zero_allowed=True,
                   hint=", e.g. 0.7")
    if not args.spec_k and (args.spec_alpha is not None or args.draft_config is not None):
        given = "--spec-alpha" if args.spec_alpha is not None else "--draft-config"
        raise ServebookError(f"{given} describes speculative decoding, which is off without --spec-k; add --spec-k K "
                             f"(drafts per step, e.g. 4) or drop {given}")
    check_config_arg(args.draft_config, "--draft-config")
    check_engine_batch(args.max_num_batched_tokens, args.max_num_seqs,
                       _default_max_num_seqs(args.gpu, getattr(args, "usage_context", "offline")))
    if args.batch is not None and args.max_num_seqs is not None and args.batch > args.max_num_seqs:
        raise ServebookError(f"--batch {args.batch} is more than --max-num-seqs {args.max_num_seqs}: vLLM never runs "
                             f"more sequences at once; lower --batch or raise --max-num-seqs")
    check_calibration(args.calibration)


def validate_step_args(args) -> None:
    """``servebook step``'s flags, before the model is read."""
    check_config_arg(args.config)
    check_gpu(args.gpu, required=True)
    check_tp_arg(args.tp)
    check_int(args.tokens, "--tokens", "prompt tokens processed in the step")
    check_int(args.prior_tokens, "--prior-tokens", "tokens already cached before this chunk", low=0)
    check_int(args.batch, "--batch", "running sequences in the decode step")
    check_number(args.context, "--context", "mean context of the running sequences in tokens", low=0)
    if args.phase == "decode" and args.prior_tokens:
        raise ServebookError("--prior-tokens belongs to --phase prefill (tokens cached before the chunk); a decode "
                             "step's cached tokens are --context")
    check_kv_cache_dtype(args.kv_cache_dtype)
    check_utilization_arg(args.gpu_memory_utilization)
    check_int(args.cudagraph_max_tokens, "--cudagraph-max-tokens", "largest CUDA-graph step in tokens")
    check_calibration(args.calibration)


def validate_simulate_args(args) -> None:
    """``servebook simulate``'s flags, before any request is drawn."""
    check_vllm_version(getattr(args, "vllm_version", None))
    check_int(args.requests, "--requests", "number of requests")
    if args.rate != math.inf:
        check_number(args.rate, "--rate", "arrival rate in requests/s", low=0, low_open=True,
                     hint=" (omit it to send every request at t=0)")
    check_int(args.num_blocks, "--num-blocks", "number of usable KV blocks")
    check_block_size_arg(args.block_size)
    check_int(args.max_num_seqs, "--max-num-seqs", "most sequences running at once")
    check_int(args.max_num_batched_tokens, "--max-num-batched-tokens", "tokens per engine step")
    check_int(args.max_model_len, "--max-model-len", "context length in tokens")
    check_int(args.long_prefill_token_threshold, "--long-prefill-token-threshold",
              "cap on one prompt's tokens per step (0 turns the cap off)", low=0)
    check_int(args.shared_prefix_tokens, "--shared-prefix-tokens", "prompt prefix all requests share, in tokens",
              low=0)
    check_seed(args.seed)
    if args.steps and not args.json:
        raise ServebookError("--steps adds the per-step trace to the JSON output; add --json (or drop --steps)")
    from servebook.simulator.config import TOY_MAX_MODEL_LEN, SchedulerConfig

    default_seqs = (_default_max_num_seqs(args.gpu, args.usage_context) if args.config and args.gpu
                    else SchedulerConfig.max_num_seqs)
    check_engine_batch(args.max_num_batched_tokens, args.max_num_seqs, default_seqs)

    check_long_prefill_threshold(args.long_prefill_token_threshold, args.max_model_len or TOY_MAX_MODEL_LEN)
    check_config_arg(args.config)
    check_gpu(args.gpu)
    check_tp_arg(args.tp)
    check_kv_cache_dtype(args.kv_cache_dtype)
    check_utilization_arg(args.gpu_memory_utilization)
    check_calibration(args.calibration)
    if args.config and args.step_model != "linear":   # the perf step model prices this model: its limits hold
        from servebook.hf_config import load_model_spec
        from servebook.vllm_rules import check_tp

        spec = load_model_spec(args.config)
        check_max_model_len(args.max_model_len, spec)
        check_tp(spec, args.tp)


#: ``servebook tune``'s numbers: key -> (what it is, low, whole number, low excluded, hint). The CLI
#: checks its flags (``--gpus``) and the live tune calculator its fields (``gpus``) with
#: :func:`check_tune_value`: the same mistake, the same message.
TUNE_VALUES = {
    "gpus": ("most GPUs the deployment may use", 1, True, False, ""),
    "rate": ("arrival rate in requests/s (all replicas)", 0, False, True, ""),
    "input_tokens": ("mean prompt length in tokens", 1, True, False, ""),
    "output_tokens": ("mean output length in tokens", 2, True, False, " (TPOT needs two tokens)"),
    "ttft_ms": ("time-to-first-token target in ms", 0, False, True, ""),
    "tpot_ms": ("time-per-output-token target in ms", 0, False, True, ""),
    "e2e_s": ("end-to-end latency target in s", 0, False, True, ""),
    "price_per_gpu_hour": ("price of one GPU-hour", 0, False, False, ""),
    "max_model_len": ("context length in tokens", 1, True, False, ""),
}


def check_tune_value(key: str, value, name: str | None = None) -> None:
    """One of ``servebook tune``'s numbers (:data:`TUNE_VALUES`); ``name`` defaults to the CLI flag."""
    what, low, whole, low_open, hint = TUNE_VALUES[key]
    name = name or "--" + key.replace("_", "-")
    if whole:
        check_int(value, name, what, low=low, hint=hint)
    else:
        check_number(value, name, what, low=low, low_open=low_open, hint=hint)


def validate_tune_args(args) -> None:
    """``servebook tune``'s flags, before the model is read."""
    check_config_arg(args.config)
    check_gpu(args.gpu, required=True)
    for key in TUNE_VALUES:
        check_tune_value(key, getattr(args, key))
    if not args.kv_cache_dtypes:
        raise ServebookError("--kv-cache-dtypes is empty; give auto, fp8 or auto,fp8")
    for dtype in args.kv_cache_dtypes:
        check_kv_cache_dtype(dtype, "--kv-cache-dtypes", allowed=("auto", "fp8"))


# -- files ----------------------------------------------------------------------------------------

def check_request_file(path, name: str = "request file") -> None:
    """A JSONL request file: given, not a directory, present."""
    from pathlib import Path

    if path is None or not str(path).strip():
        raise ServebookError(f"the {name} is empty; give the JSONL file (one JSON request per line)")
    p = Path(path)
    if p.is_dir():
        raise ServebookError(f"{name} {path} is a directory, give the JSONL file (one JSON request per line), "
                             "e.g. a file inside it")
    if not p.exists():
        raise ServebookError(f"{name} {path} does not exist; pass a JSONL file with one request per line")


def check_no_requests(count: int, path, name: str = "request file") -> None:
    """Refuse a request file with no lines at all (empty, or blank lines only)."""
    if count == 0:
        raise ServebookError(f"{name} {path} holds no requests (it is empty or has only blank lines); put one JSON "
                             'request per line, e.g. {"id": "r1", "prompt": "Hello", "max_tokens": 64}')


def check_results_file(path, name: str = "results file", *, must_exist: bool = True) -> None:
    """A results JSONL written by ``batch run``: not a directory; present when ``must_exist``."""
    from pathlib import Path

    if path is None or not str(path).strip():
        raise ServebookError(f"the {name} is empty; give the results JSONL that `servebook batch run -o` wrote")
    p = Path(path)
    if p.is_dir():
        raise ServebookError(f"{name} {path} is a directory, give the results JSONL file that "
                             "`servebook batch run -o` wrote")
    if must_exist and not p.exists():
        raise ServebookError(f"{name} {path} does not exist; give the results JSONL that `servebook batch run -o` "
                             "wrote (check the path)")


def check_output_path(path, name: str = "--output") -> None:
    """A file to write: not a directory."""
    from pathlib import Path

    if path is None or not str(path).strip():
        raise ServebookError(f"{name} is empty; give a file name to write, e.g. results.jsonl")
    if Path(path).is_dir():
        raise ServebookError(f"{name} {path} is a directory; give a file name to write, e.g. {Path(path) / 'results.jsonl'}")


def check_engine_args(args) -> None:
    """The vLLM engine options shared by ``batch run`` and ``batch ray``."""
    check_int(args.max_model_len, "--max-model-len", "context length in tokens")
    check_int(args.max_num_seqs, "--max-num-seqs", "most sequences running at once")
    check_seed(args.seed)


def validate_batch_args(args) -> None:
    """``servebook batch ACTION``'s flags and files, before any file is read or engine started."""
    action = args.batch_command
    if action in ("check", "run", "status", "shard", "merge"):
        check_request_file(args.input, "request file" if action != "merge" else "--input")
    check_int(getattr(args, "max_tokens", None), "--max-tokens", "default output tokens of a line without "
              "max_tokens")
    if action == "run":
        check_output_path(args.output)
        check_int(args.chunk_size, "--chunk-size", "requests per LLM.generate call")
        check_int(args.min_shared_tokens, "--min-shared-tokens", "shared leading tokens that make a prefix group")
        check_engine_args(args)
    elif action == "ray":
        for path in args.inputs:
            check_request_file(path)
        check_output_path(args.output)
        for option, what in (("replicas", "number of vLLM engines"), ("batch_size", "requests per Ray Data batch"),
                             ("flush_rows", "results written at a time")):
            check_int(getattr(args, option), f"--{option.replace('_', '-')}", what)
        check_engine_args(args)
    elif action == "status":
        check_results_file(args.output, must_exist=False)   # not started yet: nothing done
    elif action == "repair":
        check_results_file(args.output)
    elif action == "shard":
        from pathlib import Path

        check_int(args.shards, "--shards", "number of shard files")
        if Path(args.out_dir).exists() and not Path(args.out_dir).is_dir():
            raise ServebookError(f"--out-dir {args.out_dir} is a file; give a directory for the shard files "
                                 "(it is made if missing)")
    elif action == "merge":
        for path in args.outputs:
            check_results_file(path)
        check_output_path(args.output)


def check_not_blank(path, name: str = "request file") -> None:
    """Refuse a request file without one non-blank line (read as bytes, stopping at the first)."""
    with open(path, "rb") as handle:
        check_no_requests(int(any(line.strip() for line in handle)), path, name)
