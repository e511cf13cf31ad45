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
from servebook.validation import (check_gpu, check_int, check_kv_cache_dtype, check_tp_arg,
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
}

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
    if pasted and "command" in reply:  # vLLM loads the model's folder: a placeholder, not our temporary one
        reply["command"] = reply["command"].replace(shlex.quote(folder), "MODEL_DIR")
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


_CALCULATORS = {"plan": _plan, "kv": _kv}
#: Calculators offered only where their modules import (the step-time model imports numpy until it is
#: made numpy-free; Pyodide has no numpy): name -> (function, the modules it needs).
_OPTIONAL = {
    "chunk": (_chunk, ("servebook.perf.chunk_budget", "servebook.perf.model", "servebook.perf.gpu")),
    "fleet": (_fleet, ("servebook.perf.fleet", "servebook.perf.model", "servebook.perf.gpu")),
    "speculation": (_speculation, ("servebook.perf.speculative", "servebook.perf.model", "servebook.perf.gpu")),
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
