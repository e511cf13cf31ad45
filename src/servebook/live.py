"""The book's "Run live" calculators: one JSON-able dict in, one dict out.

The built book runs this module in the reader's browser (Pyodide, loaded from the book's own files
on a click; ``book/_ext/live/servebook-live.js`` draws the controls and shows what comes back). It
calls the library's public functions only -- :func:`servebook.make_plan` and
:func:`servebook.kv_cache.kv_cache_layout` / :func:`~servebook.kv_cache.min_kv_bytes_for_one_request`
-- so the page shows the same numbers as the notebooks and the CLI; no arithmetic lives here or in
the page. It imports no numpy (Pyodide ships none).

Calculators (``request["calculator"]``):

``plan``
    One deployment (``servebook plan``): the memory budget of one GPU, the KV cache it leaves, the
    concurrency ceiling and the recommended ``--max-num-seqs``. Inputs: ``model`` (a shipped
    reference id) or ``config_json`` (the text of a Hugging Face ``config.json``), ``gpu``, ``tp``,
    ``max_model_len`` (tokens), ``gpu_memory_utilization`` (a fraction), ``kv_cache_dtype``.
``kv``
    KV cache per token and of one sequence on one GPU. Inputs: ``model`` or ``config_json``,
    ``context_tokens``, ``kv_cache_dtype``, ``tp``.
``chunk`` (where the step-time model imports: it must run without numpy to be offered in the browser)
    The prefill chunk that fits in a target step time beside ``max_num_seqs`` decoding sequences
    (:func:`servebook.perf.chunk_budget.recommend_max_num_batched_tokens`, the calibrated step model).
    Inputs: ``model`` or ``config_json``, ``gpu``, ``tp``, ``max_num_seqs``, ``context_tokens`` (the
    decoding sequences' context), ``target_step_ms``, ``kv_cache_dtype``.
``fleet`` (same condition)
    A batch job's fleet plan (:func:`servebook.perf.fleet.plan`, as ``servebook fleet``): replicas,
    batch, hours, GPU-hours, requests/s. Inputs: ``model`` or ``config_json``, ``gpu``, ``gpus``,
    ``tp``, ``requests``, ``input_tokens`` and ``output_tokens`` (fixed lengths per request),
    ``max_num_batched_tokens``, ``cudagraph_max_tokens`` (largest step run as a CUDA graph, tokens;
    0 for vLLM's default), ``kv_cache_dtype``.
``speculation`` (same condition)
    One speculative decode step with an n-gram drafter (drafts cost no GPU time):
    :func:`servebook.perf.speculative.speculative_step` and
    :func:`~servebook.perf.speculative.break_even_acceptance`. Inputs: ``model`` or ``config_json``,
    ``gpu``, ``tp``, ``k`` (draft tokens), ``acceptance`` (per-token, a fraction), ``batch``,
    ``context_tokens``, ``kv_cache_dtype``.

``tune`` (same condition)
    The cheapest deployment that meets a p90 TTFT and TPOT target at an arrival rate
    (:func:`servebook.simulator.tune.tune`, as ``servebook tune``) on a smaller grid than the CLI's
    (:data:`LIVE_TUNE_TPS`, :data:`LIVE_TUNE_KV_CACHE_DTYPES`, at most :data:`LIVE_TUNE_MAX_GPUS`
    GPUs) so that a search takes seconds, not tens of seconds, in a browser; the reply's note gives
    the ``servebook tune`` line that runs the same search. Inputs: ``model`` or ``config_json``,
    ``gpu``, ``gpus``, ``rate`` (requests/s), ``input_tokens`` and ``output_tokens`` (fixed lengths,
    Poisson arrivals: the CLI's defaults), ``ttft_ms``, ``tpot_ms``. Its chart is the Pareto frontier
    (output tokens/s per GPU against p90 TPOT) with the pick, the target and the held-out error band;
    ``frontier`` and ``pick`` carry the same points as data.

Every reply holds ``ok``. ``ok: True`` adds ``numbers`` (a list of ``{"key", "label", "value",
"text"}``: ``value`` is the library's number, ``text`` how the page prints it), ``svg`` (a chart
drawn here, no matplotlib) and, for ``plan``, ``command`` (the ``vllm serve`` line). ``ok: False``
adds ``error``: the library's own message, which says what to change. Input values may arrive as
strings (HTML controls); a value that is not a number gets a message naming the field.
"""
from __future__ import annotations

import html
import json
import shlex
import tempfile
from pathlib import Path

from servebook._version import __version__
from servebook.errors import ServebookError
from servebook.hardware import get_gpu, gpu_names
from servebook.hf_config import load_model_spec, reference_model_ids
from servebook.kv_cache import kv_cache_layout, min_kv_bytes_for_one_request
from servebook.memory import DEFAULT_GPU_MEMORY_UTILIZATION
from servebook.plan import DEFAULT_GPU, KV_CACHE_DTYPES, make_plan
from servebook.validation import (check_gpu, check_int, check_kv_cache_dtype, check_tp_arg, check_tune_value,
                                  check_utilization_arg)

GIB = 2**30
KIB = 2**10
#: How a message names the config.json the reader pasted (instead of its temporary path).
PASTED = "the pasted config.json"
#: Why an optional calculator is missing (its modules did not import: numpy, under Pyodide).
UNAVAILABLE = ("this build of servebook's step-time model needs numpy, which the browser's Python "
               "(Pyodide) does not have; run the notebook in JupyterLab instead")

#: What the page starts from (the memory-budget notebook's defaults).
DEFAULTS = {
    "model": "gemma-4-26b-a4b",
    "gpu": DEFAULT_GPU,
    "tp": 1,
    "max_model_len": 16384,
    "gpu_memory_utilization": DEFAULT_GPU_MEMORY_UTILIZATION,
    "kv_cache_dtype": "auto",
    "context_tokens": 32768,
    "max_num_seqs": 32,
    "target_step_ms": 50,
    "k": 4,
    "acceptance": 0.7,
    "batch": 16,
    "gpus": 8,
    "requests": 1_000_000,
    "input_tokens": 2000,
    "output_tokens": 500,
    "max_num_batched_tokens": 8192,
    "cudagraph_max_tokens": 0,      # 0: vLLM's default capture size for these settings
    "rate": 4,
    "ttft_ms": 1000,
    "tpot_ms": 50,
}

#: The live tune search's grid: the CLI's search (:func:`servebook.simulator.tune.tune`) on fewer
#: candidates (``servebook tune`` tries TP 1, 2, 4, 8, both KV dtypes and any number of GPUs).
LIVE_TUNE_TPS = (1, 2)
LIVE_TUNE_KV_CACHE_DTYPES = ("auto",)
LIVE_TUNE_MAX_GPUS = 4
#: The percentile of the live tune search's targets (the CLI's default).
LIVE_TUNE_PERCENTILE = 90

#: The memory bar's parts, in the order vLLM claims them, and their colours (as in the notebook).
BAR_COLOURS = {"weights": "#4c72b0", "peak activation": "#dd8452", "non-torch": "#937860",
               "CUDA graphs": "#8172b3", "KV cache": "#55a868", "not requested": "#dddddd"}


def options() -> dict:
    """What the page's controls offer: models, GPUs, KV dtypes, calculators, the defaults; servebook's version."""
    return {
        "calculators": sorted(_CALCULATORS),
        "unavailable": {name: UNAVAILABLE for name in sorted(set(_OPTIONAL) - set(_CALCULATORS))},
        "models": reference_model_ids(),
        "gpus": gpu_names(),
        "kv_cache_dtypes": list(KV_CACHE_DTYPES),
        "defaults": {**DEFAULTS, "gpu": get_gpu(DEFAULTS["gpu"]).name},
        "version": __version__,
    }


def compute(request: dict) -> dict:
    """Run one calculator; a :class:`ServebookError` becomes ``{"ok": False, "error": message}``.

    A pasted ``config_json`` is written to a temporary ``config.json`` (the calculators read a
    path or a reference id); its path reads "the pasted config.json" in a message.
    """
    name = request.get("calculator", "plan")
    if name in _OPTIONAL and name not in _CALCULATORS:
        return {"ok": False, "error": f"the {name!r} calculator is not available here: {UNAVAILABLE}"}
    if name not in _CALCULATORS:
        return {"ok": False, "error": f"unknown calculator {name!r}; use one of {', '.join(sorted(_CALCULATORS))}"}
    with tempfile.TemporaryDirectory(prefix="servebook-live-") as folder:
        config = pasted = None
        try:
            config = _config(request, Path(folder))
            pasted = config.startswith(folder)
            reply = {"ok": True, "calculator": name, **_CALCULATORS[name](config, request)}
        except ServebookError as exc:
            return {"ok": False, "error": str(exc).replace(config, PASTED) if pasted else str(exc)}
    if pasted:  # the reader's file is their config.json, and vLLM loads the model's folder: placeholders
        # for our temporary ones (in the serve lines, and the servebook tune line the tune calculator gives)
        text = json.dumps(reply).replace(json.dumps(config)[1:-1], "config.json")
        text = text.replace(json.dumps(shlex.quote(folder))[1:-1], "MODEL_DIR")
        reply = json.loads(text.replace(Path(folder).name, PASTED))   # the model's name: its folder's
    return reply


def compute_json(request_json: str) -> str:
    """:func:`compute` with JSON text in and out (what the page calls through Pyodide)."""
    try:
        request = json.loads(request_json)
    except ValueError as exc:
        return json.dumps({"ok": False, "error": f"the request is not valid JSON ({exc})"})
    return json.dumps(compute(request))


# -- inputs ---------------------------------------------------------------------------------------

def _int(request: dict, key: str) -> int:
    value = request.get(key, DEFAULTS[key])
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ServebookError(f"{key} {value!r} is not a number; enter a whole number") from None
    if number != int(number):
        raise ServebookError(f"{key} {value!r} is not a whole number; enter a whole number")
    return int(number)


def _float(request: dict, key: str) -> float:
    value = request.get(key, DEFAULTS[key])
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ServebookError(f"{key} {value!r} is not a number; enter a fraction such as 0.9") from None


# The fields the CLI has too go through servebook.validation, as the CLI's flags do: the same
# mistake, the same message (naming the field instead of the flag).

def _gpu(request: dict) -> str:
    """The GPU name, checked: an empty or unknown name is refused (it never means the default)."""
    name = request.get("gpu", DEFAULTS["gpu"])
    check_gpu(name, "gpu", required=True)
    return name


def _tp(request: dict) -> int:
    tp = _int(request, "tp")
    check_tp_arg(tp, "tp")
    return tp


def _utilization(request: dict) -> float:
    value = _float(request, "gpu_memory_utilization")
    check_utilization_arg(value, "gpu_memory_utilization")
    return value


def _max_model_len(request: dict) -> int:
    value = _int(request, "max_model_len")
    check_int(value, "max_model_len", "context length in tokens")
    return value


def _kv_cache_dtype(request: dict, allowed=None) -> str:
    value = request.get("kv_cache_dtype", DEFAULTS["kv_cache_dtype"])
    check_kv_cache_dtype(value, "kv_cache_dtype", allowed)
    return value


def _config(request: dict, folder: Path) -> str:
    """A reference id, or the path of the pasted config.json written to ``folder``."""
    if "config_json" not in request:
        return str(request.get("model", DEFAULTS["model"]))
    text = request["config_json"]
    if text is None or not str(text).strip():
        raise ServebookError("the config.json box is empty; paste the text of the model's config.json "
                             "(from its Hugging Face page), or pick a model from the list")
    path = folder / "config.json"
    path.write_text(str(text))
    return str(path)


# -- calculators ----------------------------------------------------------------------------------

def _plan(config: str, request: dict) -> dict:
    plan = make_plan(
        config,
        gpu=_gpu(request),
        tp=_tp(request),
        max_model_len=_max_model_len(request),
        gpu_memory_utilization=_utilization(request),
        kv_cache_dtype=_kv_cache_dtype(request, KV_CACHE_DTYPES),
    )
    d = plan.to_dict()
    numbers = [
        _number("weights_gib", "weights per GPU", d["weights_gib"], f"{d['weights_gib']:.2f} GiB"),
        _number("activation_gib", "peak activation", d["activation_gib"], f"{d['activation_gib']:.2f} GiB"),
        _number("non_torch_gib", "non-torch memory", d["non_torch_gib"], f"{d['non_torch_gib']:.2f} GiB"),
        _number("cudagraph_gib", "CUDA graphs", d["cudagraph_gib"], f"{d['cudagraph_gib']:.2f} GiB"),
        _number("available_kv_gib", "KV cache", d["available_kv_gib"], f"{d['available_kv_gib']:.2f} GiB"),
        _number("kv_bytes_per_token", "KV per token (this GPU)", d["kv_bytes_per_token"],
                f"{d['kv_bytes_per_token'] / KIB:,.1f} KiB"),
        _number("kv_cache_tokens", "KV cache tokens", d["kv_cache_tokens"], f"{d['kv_cache_tokens']:,}"),
        _number("max_concurrency", f"requests of {d['max_model_len']:,} tokens at once", d["max_concurrency"],
                f"{d['max_concurrency']:.2f}x"),
        _number("recommended_max_num_seqs", "recommended --max-num-seqs", d["recommended_max_num_seqs"],
                f"{d['recommended_max_num_seqs']:,}"),
    ]
    return {"model": d["model"], "gpu": d["gpu"], "numbers": numbers, "svg": memory_bar_svg(plan),
            "command": d["vllm_serve_command"]}


def _kv(config: str, request: dict) -> dict:
    spec = load_model_spec(config)
    tokens = _int(request, "context_tokens")
    if tokens < 1:
        raise ServebookError(f"context_tokens {tokens} is out of range; use a positive number of tokens")
    layout = kv_cache_layout(spec, kv_cache_dtype=_kv_cache_dtype(request), tp=_tp(request))
    per_sequence = min_kv_bytes_for_one_request(layout, tokens, in_flight_tokens=0)
    numbers = [
        _number("kv_bytes_per_token", "KV per token (this GPU)", layout.kv_bytes_per_token,
                f"{layout.kv_bytes_per_token / KIB:,.1f} KiB"),
        _number("kv_bytes_per_sequence", f"one sequence of {tokens:,} tokens", per_sequence,
                f"{per_sequence / GIB:,.2f} GiB"),
    ]
    return {"model": spec.name, "numbers": numbers, "svg": ""}


def _number(key: str, label: str, value, text: str) -> dict:
    return {"key": key, "label": label, "value": value, "text": text}


def _chunk(config: str, request: dict) -> dict:
    from servebook.perf.chunk_budget import mixed_step_s, recommend_max_num_batched_tokens
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients
    from servebook.vllm_rules import check_tp

    spec = load_model_spec(config)
    gpu = gpu_numbers(_gpu(request))
    tp, seqs, context = _tp(request), _int(request, "max_num_seqs"), _int(request, "context_tokens")
    target_ms, dtype = _float(request, "target_step_ms"), _kv_cache_dtype(request)
    check_tp(spec, tp)
    if seqs < 1 or context < 0 or not target_ms > 0:
        raise ServebookError("max_num_seqs must be >= 1, context_tokens >= 0 and target_step_ms > 0")
    coeffs, source = calibrated_coefficients(gpu.name)
    r = recommend_max_num_batched_tokens(spec, gpu, coeffs, target_step_s=target_ms / 1e3, max_num_seqs=seqs,
                                         decode_context_tokens=context, tp=tp, kv_cache_dtype=dtype)
    decode_only_s = mixed_step_s(spec, gpu, coeffs, prefill_tokens=0, decode_batch=seqs,
                                 decode_context_tokens=context, tp=tp, kv_cache_dtype=dtype)
    numbers = [
        _number("decode_only_ms", f"step with {seqs:,} decodes only", decode_only_s * 1e3, f"{decode_only_s * 1e3:.1f} ms"),
        _number("chunk_tokens", "prefill tokens that fit beside them", r["chunk_tokens"], f"{r['chunk_tokens']:,}"),
        _number("budget_tokens", "token budget (chunk + decodes)", r["budget_tokens"], f"{r['budget_tokens']:,}"),
        _number("recommended", "recommended --max-num-batched-tokens", r["recommended"], f"{r['recommended']:,}"),
        _number("recommended_step_ms", "its full step", r["recommended_step_s"] * 1e3,
                f"{r['recommended_step_s'] * 1e3:.1f} ms"),
    ]
    return {"model": spec.name, "gpu": gpu.name, "numbers": numbers, "svg": "", "note": f"step model {source}"}


def _speculation(config: str, request: dict) -> dict:
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients
    from servebook.perf.speculative import break_even_acceptance, speculative_step
    from servebook.vllm_rules import check_tp

    spec = load_model_spec(config)
    gpu = gpu_numbers(_gpu(request))
    tp, k, batch, context = _tp(request), *(_int(request, key) for key in ("k", "batch", "context_tokens"))
    alpha, dtype = _float(request, "acceptance"), _kv_cache_dtype(request)
    check_tp(spec, tp)
    if not (0 <= alpha <= 1) or k < 1 or batch < 1 or context < 0:
        raise ServebookError("use k >= 1 draft tokens, an acceptance between 0 and 1, batch >= 1 and context_tokens >= 0")
    coeffs, source = calibrated_coefficients(gpu.name)
    step = speculative_step(spec, gpu, coeffs, k=k, alpha=alpha, batch=batch, context_tokens=context, tp=tp,
                            kv_cache_dtype=dtype)
    even = break_even_acceptance(spec, gpu, coeffs, k=k, batch=batch, context_tokens=context, tp=tp,
                                 kv_cache_dtype=dtype)
    numbers = [
        _number("plain_step_ms", "plain decode step", step.plain_step_s * 1e3, f"{step.plain_step_s * 1e3:.2f} ms"),
        _number("verify_step_ms", f"verify step ({k + 1} positions per sequence)", step.verify_s * 1e3,
                f"{step.verify_s * 1e3:.2f} ms"),
        _number("tokens_per_step", "tokens per sequence per step", step.tokens_per_step, f"{step.tokens_per_step:.2f}"),
        _number("speedup", "decode speed-up", step.speedup, f"{step.speedup:.2f}x"),
        _number("break_even_acceptance", "break-even acceptance", even,
                "none (never pays)" if even is None else f"{even:.1%}"),
    ]
    return {"model": spec.name, "gpu": gpu.name, "numbers": numbers, "svg": "",
            "note": f"n-gram drafter (no GPU cost); step model {source}"}


#: The fleet calculator's whole-number inputs and what they are (``servebook fleet`` checks its flags alike).
_FLEET_AT_LEAST = {"gpus": "GPUs in the fleet", "tp": "tensor-parallel size", "requests": "requests in the job",
                   "input_tokens": "mean prompt length in tokens", "output_tokens": "mean output length in tokens",
                   "max_num_batched_tokens": "tokens per engine step"}


def _fleet(config: str, request: dict) -> dict:
    from servebook.perf.fleet import Deployment, LengthDistribution, Workload, plan
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients

    values = {key: _int(request, key) for key in _FLEET_AT_LEAST}
    for key, what in _FLEET_AT_LEAST.items():
        check_int(values[key], key, what)
    dtype = _kv_cache_dtype(request)
    spec = load_model_spec(config)
    gpu = gpu_numbers(_gpu(request))
    coeffs, source = calibrated_coefficients(gpu.name)
    job = Workload(values["requests"], LengthDistribution.fixed(values["input_tokens"]),
                   LengthDistribution.fixed(values["output_tokens"]))
    graphs = _int(request, "cudagraph_max_tokens")
    if graphs < 0:
        raise ServebookError(f"cudagraph_max_tokens {graphs} is out of range; use 0 for vLLM's default or the "
                             "largest step, in tokens, that runs as a CUDA graph")
    p = plan(job, Deployment.of(spec, gpu=gpu, gpus=values["gpus"], name=spec.name, tp=values["tp"],
                             max_num_batched_tokens=values["max_num_batched_tokens"],
                             cudagraph_max_tokens=graphs or None, kv_cache_dtype=dtype), coeffs)
    numbers = [
        _number("replicas", f"replicas of TP={p.tp}", p.replicas, f"{p.replicas:,}"),
        _number("batch", "decode batch per replica", p.batch, f"{p.batch:,} (KV cache holds {p.batch_kv_bound:,})"),
        _number("step_ms", "mixed step", p.step_s * 1e3, f"{p.step_s * 1e3:.1f} ms ({p.bound})"),
        _number("hours", "wall-clock hours", p.hours,
                f"{p.hours:,.1f} h ({p.prefill_hours:,.1f} prefill + {p.decode_hours:,.1f} decode)"),
        _number("gpu_hours", "GPU-hours", p.gpu_hours, f"{p.gpu_hours:,.0f}"),
        _number("requests_per_s", "requests per second", p.requests_per_s, f"{p.requests_per_s:,.1f}"),
    ]
    return {"model": spec.name, "gpu": gpu.name, "numbers": numbers, "svg": "",
            "note": "; ".join((*p.notes, f"step model {source}"))}


#: The tune calculator's numeric fields, checked as ``servebook tune`` checks its flags.
_TUNE_FIELDS = {"gpus": _int, "rate": _float, "input_tokens": _int, "output_tokens": _int, "ttft_ms": _float,
                "tpot_ms": _float}


def tune_cli_line(config: str, request: dict) -> str:
    """The ``servebook tune`` line that runs the live search for ``request`` (same grid, same answer)."""
    v = {key: read(request, key) for key, read in _TUNE_FIELDS.items()}
    args = ["servebook", "tune", "--config", config, "--gpu", str(request.get("gpu", DEFAULTS["gpu"])),
            "--gpus", str(v["gpus"]), "--rate", f"{v['rate']:g}", "--input-tokens", str(v["input_tokens"]),
            "--output-tokens", str(v["output_tokens"]), "--ttft-ms", f"{v['ttft_ms']:g}",
            "--tpot-ms", f"{v['tpot_ms']:g}", "--percentile", str(LIVE_TUNE_PERCENTILE),
            "--tp", ",".join(map(str, LIVE_TUNE_TPS)), "--kv-cache-dtypes", ",".join(LIVE_TUNE_KV_CACHE_DTYPES)]
    return shlex.join(args)


def _tune(config: str, request: dict) -> dict:
    from servebook.simulator.online import OnlineWorkload, latency_band
    from servebook.simulator.tune import LatencyTargets, tune

    gpu = _gpu(request)
    request = {"gpus": LIVE_TUNE_MAX_GPUS, **request}   # the fleet's default (8) is more than the live grid holds
    v = {key: read(request, key) for key, read in _TUNE_FIELDS.items()}
    for key, value in v.items():
        check_tune_value(key, value, key)
    check_int(v["gpus"], "gpus", "most GPUs the live search may use", high=LIVE_TUNE_MAX_GPUS,
              hint=" (servebook tune searches any number)")
    result = tune(config, gpu=gpu, max_gpus=v["gpus"], tps=LIVE_TUNE_TPS, kv_cache_dtypes=LIVE_TUNE_KV_CACHE_DTYPES,
                  workload=OnlineWorkload(v["rate"], v["input_tokens"], v["output_tokens"]),
                  targets=LatencyTargets(ttft_s=v["ttft_ms"] / 1e3, tpot_s=v["tpot_ms"] / 1e3,
                                         percentile=LIVE_TUNE_PERCENTILE))
    q, best = LIVE_TUNE_PERCENTILE, result.best
    band = latency_band(gpu)
    frontier = [_tune_point(result, c) for c in result.frontier()]
    numbers = [_number("tried", "configurations tried", len(result.tried), f"{len(result.tried):,}")]
    if best is None:
        numbers.append(_number("pick_gpus", "cheapest that meets the targets", None, "none: " + result.binding))
    else:
        p = best.prediction
        numbers += [
            _number("pick_gpus", "cheapest that meets the targets",  best.gpus,
                    f"{best.replicas} replica(s) x TP {best.plan.tp} = {best.gpus} GPU(s)"),
            _number("pick_flags", "flags changed from vLLM's defaults", result.flags_text(best), result.flags_text(best)),
            _number("pick_ttft_ms", f"p{q} TTFT (predicted)", p.ttft_s[q] * 1e3,
                    _with_band(p.ttft_s[q], band and band.get(f"ttft_p{q}"))),
            _number("pick_tpot_ms", f"p{q} TPOT (predicted)", p.tpot_s[q] * 1e3,
                    _with_band(p.tpot_s[q], band and band.get(f"tpot_p{q}"))),
            _number("pick_tokens_per_s_per_gpu", "output tokens/s per GPU", best.output_tokens_per_s_per_gpu,
                    f"{best.output_tokens_per_s_per_gpu:,.0f}"),
        ]
    runs = next(iter(band.values()))["runs"] if band else 0
    note = (f"Live grid: TP {' and '.join(map(str, LIVE_TUNE_TPS))}, KV dtype "
            f"{', '.join(LIVE_TUNE_KV_CACHE_DTYPES)}, at most {LIVE_TUNE_MAX_GPUS} GPUs; targets must be beaten by "
            f"{result.targets.factor - 1:.0%} (the model's error allowance). "
            + (f"Band: where measured values fell for 80% of {runs} held-out vllm serve runs on {gpu}. "
               if band else "No held-out vllm serve run on this GPU: the prediction is unchecked there. ")
            + f"The same search on the command line: {tune_cli_line(config, request)}")
    reply = {"model": result.tried[0].plan.spec.name if result.tried else config, "gpu": gpu, "numbers": numbers,
             "svg": frontier_svg(result, band), "frontier": frontier, "note": note,
             "pick": None if best is None else _tune_point(result, best), "binding": result.binding or None}
    if best is not None:
        reply["command"] = best.serve_command()
    return reply


def _tune_point(result, c) -> dict:
    q = result.targets.percentile
    return {"gpus": c.gpus, "tp": c.plan.tp, "replicas": c.replicas, "flags": result.flags_text(c),
            "tokens_per_s_per_gpu": c.output_tokens_per_s_per_gpu, "ttft_ms": c.prediction.ttft_s[q] * 1e3,
            "tpot_ms": c.prediction.tpot_s[q] * 1e3, "meets": c.meets, "serve_command": c.serve_command()}


def _measured_range(predicted_s: float, band: dict) -> tuple[float, float]:
    """Where the measured value lies for 80% of held-out runs, given the prediction (seconds):
    the band is predicted / measured - 1, so measured = predicted / (1 + error)."""
    return predicted_s / (1 + band["p90"]), predicted_s / (1 + band["p10"])


def _with_band(predicted_s: float, band: dict | None) -> str:
    text = f"{predicted_s * 1e3:,.1f} ms"
    if not band:
        return text
    lo, hi = _measured_range(predicted_s, band)
    return f"{text} (held-out band {lo * 1e3:,.1f}-{hi * 1e3:,.1f} ms)"


_CALCULATORS = {"plan": _plan, "kv": _kv}
#: Calculators offered only where their modules import (the step-time model imports numpy until it is
#: made numpy-free; Pyodide has no numpy): name -> (function, the modules it needs).
_OPTIONAL = {
    "chunk": (_chunk, ("servebook.perf.chunk_budget", "servebook.perf.model", "servebook.perf.gpu")),
    "fleet": (_fleet, ("servebook.perf.fleet", "servebook.perf.model", "servebook.perf.gpu")),
    "speculation": (_speculation, ("servebook.perf.speculative", "servebook.perf.model", "servebook.perf.gpu")),
    "tune": (_tune, ("servebook.simulator.tune", "servebook.simulator.online", "servebook.perf.model")),
}


def _importable(modules) -> bool:
    import importlib

    try:
        for module in modules:
            importlib.import_module(module)
    except ImportError:
        return False
    return True


_CALCULATORS.update({name: fn for name, (fn, modules) in _OPTIONAL.items() if _importable(modules)})


# -- chart ----------------------------------------------------------------------------------------

def memory_bar_svg(plan, width_px: int = 640) -> str:
    """One GPU's memory as a horizontal bar (SVG text): weights, activation, ..., KV cache, rest."""
    b = plan.budget
    parts = {"weights": b.weights_gib, "peak activation": b.activation_gib, "non-torch": b.non_torch_gib,
             "CUDA graphs": b.cudagraph_gib, "KV cache": b.available_kv_gib,
             "not requested": b.total_memory_gib - b.requested_gib}
    scale = width_px / b.total_memory_gib
    bar, legend, left = [], [], 0.0
    for i, (name, gib) in enumerate(parts.items()):
        colour = BAR_COLOURS[name]
        bar.append(f'<rect x="{left * scale:.1f}" y="0" width="{max(gib, 0) * scale:.1f}" height="28" '
                   f'fill="{colour}"><title>{name} {gib:.2f} GiB</title></rect>')
        legend.append(f'<rect x="{(i % 3) * 215}" y="{40 + (i // 3) * 18}" width="10" height="10" fill="{colour}"/>'
                      f'<text x="{(i % 3) * 215 + 14}" y="{49 + (i // 3) * 18}">{name} {gib:.1f} GiB</text>')
        left += max(gib, 0)
    title = html.escape(f"{plan.spec.name} on {plan.gpu_name}, TP={plan.tp}: {b.total_memory_gib:.1f} GiB per GPU")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="servebook-live-bar" width="{width_px}" height="80" '
            f'viewBox="0 0 {width_px} 80" font-size="12" font-family="sans-serif" role="img" '
            f'aria-label="{title}"><title>{title}</title>{"".join(bar)}{"".join(legend)}</svg>')


def _ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top`` (1, 2 or 5 times a power of ten apart)."""
    import math

    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(math.ceil(top / step)) + 1)]


def frontier_svg(result, band: dict | None, width_px: int = 640, height_px: int = 360) -> str:
    """The tune search as a chart (SVG text): output tokens/s per GPU against the target percentile's
    TPOT for every candidate that keeps up (grey), the Pareto frontier (blue line), the pick (orange,
    with the held-out band as a bar), the TPOT target (red dashed) and the target less the allowance
    (red dotted)."""
    q, t = result.targets.percentile, result.targets
    keep = [c for c in result.tried if not c.prediction.saturated]
    front = result.frontier()
    xs = [c.prediction.tpot_s[q] * 1e3 for c in keep] + [t.tpot_s * 1e3 * 1.1]
    ys = [c.output_tokens_per_s_per_gpu for c in keep] or [1.0]
    left, right, top, bottom = 64, 16, 28, 70
    xt, yt = _ticks(max(xs) * 1.05), _ticks(max(ys) * 1.1)
    w, h = width_px - left - right, height_px - top - bottom

    def X(ms):
        return left + w * ms / xt[-1]

    def Y(v):
        return top + h * (1 - v / yt[-1])

    parts = [f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>']
    for v in xt:
        parts.append(f'<line x1="{X(v):.1f}" y1="{top + h}" x2="{X(v):.1f}" y2="{top + h + 4}" stroke="#999"/>'
                     f'<text x="{X(v):.1f}" y="{top + h + 16}" text-anchor="middle">{v:g}</text>')
    for v in yt:
        parts.append(f'<line x1="{left - 4}" y1="{Y(v):.1f}" x2="{left}" y2="{Y(v):.1f}" stroke="#999"/>'
                     f'<text x="{left - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:,.0f}</text>')
    parts.append(f'<text x="{left + w / 2}" y="{top + h + 32}" text-anchor="middle">p{q} TPOT (ms, predicted)</text>'
                 f'<text x="14" y="{top + h / 2}" text-anchor="middle" transform="rotate(-90 14 {top + h / 2})">'
                 'output tokens/s per GPU</text>')
    allowed = t.tpot_s / t.factor * 1e3
    parts.append(f'<line class="target" x1="{X(t.tpot_s * 1e3):.1f}" y1="{top}" x2="{X(t.tpot_s * 1e3):.1f}" '
                 f'y2="{top + h}" stroke="#c44e52" stroke-dasharray="6 4"><title>p{q} TPOT target '
                 f'{t.tpot_s * 1e3:g} ms</title></line>'
                 f'<line class="allowance" x1="{X(allowed):.1f}" y1="{top}" x2="{X(allowed):.1f}" y2="{top + h}" '
                 f'stroke="#c44e52" stroke-dasharray="2 3"><title>target less the {t.factor - 1:.0%} allowance: '
                 f'{allowed:.1f} ms</title></line>'
                 f'<text x="{X(t.tpot_s * 1e3) + 4:.1f}" y="{top + 12}" fill="#c44e52">target</text>')
    for c in keep:
        tip = html.escape(f"{c.replicas} x TP {c.plan.tp}, {result.flags_text(c)}: "
                          f"{c.output_tokens_per_s_per_gpu:,.0f} tok/s/GPU, TPOT {c.prediction.tpot_s[q] * 1e3:.1f} ms, "
                          f"TTFT {c.prediction.ttft_s[q] * 1e3:,.0f} ms" + ("" if c.meets else " (misses)"))
        parts.append(f'<circle class="candidate" cx="{X(c.prediction.tpot_s[q] * 1e3):.1f}" '
                     f'cy="{Y(c.output_tokens_per_s_per_gpu):.1f}" r="3.5" fill="#bbbbbb"><title>{tip}</title></circle>')
    if front:
        path = " ".join(f"{X(c.prediction.tpot_s[q] * 1e3):.1f},{Y(c.output_tokens_per_s_per_gpu):.1f}"
                        for c in sorted(front, key=lambda c: c.prediction.tpot_s[q]))
        parts.append(f'<polyline class="frontier" points="{path}" fill="none" stroke="#4c72b0" stroke-width="2"/>')
        parts += [f'<circle class="frontier-point" cx="{X(c.prediction.tpot_s[q] * 1e3):.1f}" '
                  f'cy="{Y(c.output_tokens_per_s_per_gpu):.1f}" r="4" fill="#4c72b0"/>' for c in front]
    best = result.best
    if best is not None:
        x, y = best.prediction.tpot_s[q] * 1e3, best.output_tokens_per_s_per_gpu
        b = band and band.get(f"tpot_p{q}")
        if b:
            lo, hi = (v * 1e3 for v in _measured_range(best.prediction.tpot_s[q], b))
            parts.append(f'<line class="band" x1="{X(lo):.1f}" y1="{Y(y):.1f}" x2="{X(hi):.1f}" y2="{Y(y):.1f}" '
                         f'stroke="#dd8452" stroke-width="6" stroke-opacity="0.45"><title>held-out band: measured '
                         f'{lo:.1f}-{hi:.1f} ms</title></line>')
        parts.append(f'<circle class="pick" cx="{X(x):.1f}" cy="{Y(y):.1f}" r="7" fill="#dd8452" stroke="#000">'
                     f'<title>{html.escape("pick: " + best.serve_command())}</title></circle>')
    where = (f"pick: {best.replicas} x TP {best.plan.tp} = {best.gpus} GPU(s)" if best else "nothing meets the targets")
    title = html.escape(f"{result.tried[0].plan.spec.name if result.tried else ''} on {result.gpu}, "
                        f"{result.workload.rate_per_s:g} requests/s: {where}")
    keys = (("#bbbbbb", "other configurations that keep up"), ("#4c72b0", "Pareto frontier"),
            ("#dd8452", "pick (bar: held-out band)"), ("#c44e52", "target; dotted: less the allowance"))
    legend, x = [f'<text x="{left}" y="16">{title}</text>'], float(left)
    for colour, text in keys:   # one row under the x-axis label, ~6 px per character at 10 px
        legend.append(f'<circle cx="{x + 4:.0f}" cy="{height_px - 26}" r="4" fill="{colour}"/>'
                      f'<text x="{x + 11:.0f}" y="{height_px - 22}" font-size="10">{html.escape(text)}</text>')
        x += 20 + 4.9 * len(text)
    legend = "".join(legend)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="servebook-live-frontier" width="{width_px}" '
            f'height="{height_px}" viewBox="0 0 {width_px} {height_px}" font-size="12" font-family="sans-serif" '
            f'role="img" aria-label="{title}"><title>{title}</title>{legend}{"".join(parts)}</svg>')
