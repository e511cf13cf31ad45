"""Error bands: how far held-out measurements lay from the prediction, per regime, and what was never measured.

A prediction (``servebook fleet``'s job, ``servebook step``'s step, ``servebook simulate``'s replay)
falls in one *regime*: the model's kind (:func:`model_kind`: dense, MoE, MLA+MoE, sliding-window or
hybrid), for a step its kind (decode, mixed prefill+decode, prefill) and whether vLLM replays it as a
CUDA graph or runs it eagerly, and the TP size (1 or more). The band of a regime comes from HELD-OUT
measurements only (points and jobs no fit saw; ``servebook.lab.e2e.bands`` collects them, and
``scripts/fit_error_bands.py`` writes them to ``perf/data/error_bands.json``): the 10th and 90th
percentiles of the signed relative errors when it has at least :data:`MIN_POINTS_FOR_PERCENTILES` of
them, else their minimum and maximum (the band says which), with the count.

The error is ``measured / predicted seconds - 1`` (equivalently predicted / measured rate - 1): a band
of -8% to +12% means the held-out measurements took between 8% less and 12% more time than predicted.

:func:`assess` is the one home of the rules that say when a query lies outside what was measured
(another GPU, TP > 1 where none was recorded, a longer context, quantized weights, speculative
decoding, open arrivals, a regime with no held-out point); the commands print what it returns.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from servebook.errors import ServebookError
from servebook.model_spec import ModelSpec
from servebook.reductions import percentile

#: The committed bands (written by scripts/fit_error_bands.py; do not edit).
ERROR_BANDS_FILE = Path(__file__).resolve().parent / "data" / "error_bands.json"
#: Fewer held-out errors than this: the band is their minimum and maximum, not the 10th/90th percentiles.
MIN_POINTS_FOR_PERCENTILES = 5
#: The percentiles a band spans when it has enough points.
PERCENTILES = (10, 90)
#: Model kinds, in the words the bands use.
KINDS = {"dense": "dense", "moe": "MoE", "mla_moe": "MLA+MoE", "sliding": "sliding-window/hybrid"}
#: What a band describes: the job with ramp and drain (fleet's default answer), fleet's steady state
#: alone, the simulator's replay of a job, one engine step.
PREDICTIONS = ("job", "steady_state", "simulated", "step")
STEP_KINDS = ("decode", "mixed", "prefill")


def model_kind(spec: ModelSpec) -> str:
    """The kind of a model for the bands: ``mla_moe`` (multi-head latent attention with routed experts),
    ``moe`` (routed experts, any attention), ``sliding`` (some layers attend a sliding window: sliding-window
    and hybrid sliding/global models) or ``dense``."""
    kinds = {layer.kind for layer in spec.layers}
    if spec.moe is not None:
        return "mla_moe" if "mla" in kinds else "moe"
    if "mla" in kinds:
        return "mla_moe"  # no dense MLA model was recorded: it shares MLA+MoE's attention, not its experts
    return "sliding" if "sliding" in kinds else "dense"


def band_of(errors: list[float]) -> dict | None:
    """The band of a set of signed relative errors: ``lo``, ``hi``, ``count``, ``method``.

    With at least :data:`MIN_POINTS_FOR_PERCENTILES` errors, ``lo``/``hi`` are their 10th and 90th
    percentiles (``method`` ``"p10/p90"``, numpy's linear rule); with fewer, their minimum and maximum
    (``"min/max"``). None for no errors: a regime with no held-out point has no band.
    """
    xs = [float(e) for e in errors]
    if not xs:
        return None
    if len(xs) >= MIN_POINTS_FOR_PERCENTILES:
        lo, hi, method = percentile(xs, PERCENTILES[0]), percentile(xs, PERCENTILES[1]), "p10/p90"
    else:
        lo, hi, method = min(xs), max(xs), "min/max"
    return {"lo": round(lo, 4), "hi": round(hi, 4), "count": len(xs), "method": method}


def regime_key(prediction: str, kind: str, tp: int, step: str | None = None, graph: bool | None = None) -> str:
    """The key of a regime in the bands file, e.g. ``job/moe/tp1`` or ``step/dense/decode/graph/tp>1``."""
    if prediction not in PREDICTIONS or kind not in KINDS:
        raise ServebookError(f"no regime {prediction!r}/{kind!r}: predictions {PREDICTIONS}, kinds {tuple(KINDS)}")
    tp_class = "tp1" if int(tp) <= 1 else "tp>1"
    if prediction != "step":
        return f"{prediction}/{kind}/{tp_class}"
    if step not in STEP_KINDS:
        raise ServebookError(f"step kind {step!r} is none of {STEP_KINDS}")
    return f"step/{kind}/{step}/{'graph' if graph else 'eager'}/{tp_class}"


@lru_cache(maxsize=4)
def _read(path: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ServebookError(f"cannot read the error bands {path}: {exc} (run scripts/fit_error_bands.py)") from None
    if doc.get("schema") != "servebook.error_bands/1":
        raise ServebookError(f"{path} is not a servebook.error_bands/1 file")
    return doc


def load_bands(path: str | Path | None = None) -> dict:
    """The committed bands file (:data:`ERROR_BANDS_FILE` unless ``path``)."""
    return _read(str(path or ERROR_BANDS_FILE))


@dataclass(frozen=True)
class Query:
    """What a prediction is of, as far as the bands care.

    Attributes:
        prediction: one of :data:`PREDICTIONS`.
        spec: the model.
        gpu_name: the catalogue name of the GPU it is priced on (``GPUNumbers.name``).
        tp: tensor-parallel size.
        context_tokens: the longest context the prediction prices (tokens): a decode step's mean
            context, a prefill's prompt (with its cached part), a job's mean prompt plus mean output.
        kv_cache_dtype: ``auto`` or ``fp8``.
        step: for a step, one of :data:`STEP_KINDS`.
        graph: for a step, whether vLLM replays it as a CUDA graph (full or piecewise).
        speculative: speculative decoding in the prediction.
        open_arrivals: requests arriving over time (the recorded jobs submitted every request at once).
    """

    prediction: str
    spec: ModelSpec
    gpu_name: str
    tp: int = 1
    context_tokens: float = 0.0
    kv_cache_dtype: str = "auto"
    step: str | None = None
    graph: bool | None = None
    speculative: bool = False
    open_arrivals: bool = False


def outside_measured(q: Query, doc: dict) -> list[str]:
    """Why ``q`` lies outside what was measured (empty when it does not): the one home of these rules."""
    from servebook.hf_config import spec_quantization

    kind = model_kind(q.spec)
    seen = doc["measured"].get(kind, {})
    label = KINDS[kind]
    why = []
    if q.gpu_name != doc["gpu"]:
        why.append(f"{q.gpu_name}: every measurement is from one {doc['gpu']} (no calibration or held-out "
                   "point on this GPU)")
    if int(q.tp) > 1 and not any(t > 1 for t in seen.get(_tp_field(q.prediction), [])):
        what = "step" if q.prediction == "step" else "job"
        why.append(f"TP {q.tp}: no {label} {what} with TP > 1 was recorded")
    longest = seen.get("max_context_tokens", 0)
    if q.context_tokens > longest:
        why.append(f"context {q.context_tokens:,.0f} tokens: longer than any recorded for a {label} model "
                   f"({longest:,.0f})")
    if q.kv_cache_dtype not in seen.get("kv_cache_dtypes", []):
        why.append(f"KV cache {q.kv_cache_dtype}: none recorded for a {label} model")
    quant = spec_quantization(q.spec)
    if quant is not None:
        why.append(f"quantized weights ({quant.scheme.name}): no step time of such weights was measured")
    if q.speculative:
        why.append("speculative decoding: no job or step with it was measured")
    if q.open_arrivals:
        why.append("requests arriving at a rate: every recorded job submitted its requests at once")
    return why


def _tp_field(prediction: str) -> str:
    return "step_tp" if prediction == "step" else "job_tp"


def assess(q: Query, path: str | Path | None = None) -> dict:
    """The band of ``q``'s regime and what lies outside what was measured.

    Returns ``regime`` (its key), ``kind``, ``band`` (:func:`band_of`'s dict plus ``unit`` and
    ``sources``, the bands file also naming its members; None: no held-out measurement of this regime),
    ``outside`` (reasons, see :func:`outside_measured`), ``covers_query`` (a band exists and nothing is outside), ``error``
    (how the errors are defined) and ``gpu`` (where they were measured).
    """
    doc = load_bands(path)
    kind = model_kind(q.spec)
    key = regime_key(q.prediction, kind, q.tp, q.step, q.graph)
    band = doc["bands"].get(key)
    band = None if band is None else {k: v for k, v in band.items() if k != "members"}  # the file names them
    outside = outside_measured(q, doc)
    return {"regime": key, "kind": KINDS[kind], "band": band, "outside": outside,
            "covers_query": band is not None and not outside, "error": doc["error"], "gpu": doc["gpu"]}


def _pct(x: float) -> str:
    return f"{100 * x:+.0f}%"


def band_text(a: dict, unit: str) -> str:
    """One line for a prediction's band: ``held-out band -8% to +12% (p10/p90 of 6 MoE jobs)``, or why none.

    ``unit``: what the band's count counts (``jobs``, ``steps``...); ``a``: :func:`assess`'s dict.
    """
    b = a["band"]
    if b is None:
        text = "no held-out measurement of this regime: no band"
    else:
        text = (f"held-out band {_pct(b['lo'])} to {_pct(b['hi'])} ({b['method']} of {b['count']} {a['kind']} "
                f"{b.get('unit', unit)}, measured / predicted time - 1)")
    if a["outside"]:
        text += "; OUTSIDE what was measured: " + "; ".join(a["outside"]) + (
            " -- the band above does not cover this query" if b is not None else "")
    return text


def scaled(value: float, band: dict | None, *, rate: bool = False) -> list[float] | None:
    """``[low, high]`` of a predicted ``value`` under a band: a time times 1 + lo .. 1 + hi; a rate
    (``rate``) divided by them, so its low end is the slow one. None without a band."""
    if band is None:
        return None
    if rate:
        return [value / (1 + band["hi"]), value / (1 + band["lo"])]
    return [value * (1 + band["lo"]), value * (1 + band["hi"])]
