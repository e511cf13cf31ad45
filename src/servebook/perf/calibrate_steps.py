"""Calibration, second stage: what a step costs when vLLM does not replay it as one full CUDA graph.

The first stage (:mod:`servebook.perf.calibrate`) fits the step-time coefficients to a sweep of pure
decode steps and pure prefills. Two costs stay invisible there, and a real job is full of them:

* a step that carries a prefill chunk beside decoding requests, of at most the largest CUDA-graph
  size, replays *piecewise* graphs with attention launched eagerly between them
  (``piecewise_sequence_s`` per request in the step, added to it);
* a larger step runs eagerly, the host launching every kernel; for moderate GPU work that launch
  time is the step's floor (``eager_layer_s`` per layer, ``eager_moe_layer_s`` more per MoE layer).

The sweep's prefills are long and GPU-bound, so the first stage cannot identify these three. This
stage keeps every first-stage coefficient and fits just them, jointly to

1. the first stage's calibration points again (so the sweep stays explained), and
2. every step that carried a prefill chunk, or decoded more sequences than the largest CUDA graph
   holds (it runs eagerly), in the end-to-end jobs (``labs/results/e2e``) of the
   models the fleet model is *fitted* on (:func:`fitted_models`, ``perf/data/e2e_split.json``; any
   record of their configs, :func:`fitted_shape`; :func:`stage_two_models`), where an MoE's tokens were routed uniformly as the
   model prices them (:func:`fit_records`); the other models' jobs stay held out. A step's measured
   time is the interval from its scheduling to the next step's.

The loss is soft-L1 on log error (scale 0.1): a step that paid a one-time kernel compilation
(seconds instead of milliseconds) cannot pull the fit. Each of the two sets weighs alike in total.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from servebook.errors import ServebookError

#: Which models' end-to-end jobs a fit may use (the rest are held out); see the module docstring.
SPLIT_PATH = Path(__file__).resolve().parent / "data" / "e2e_split.json"
#: The coefficients this stage fits.
FITTED = ("piecewise_sequence_s", "eager_layer_s", "eager_moe_layer_s", "eager_sequence_s")
_BOUNDS = {"eager_layer_s": (1e-7, 1e-2), "eager_moe_layer_s": (1e-7, 1e-2),
           "eager_sequence_s": (1e-8, 1e-3), "piecewise_sequence_s": (1e-8, 1e-3)}
_START = {"eager_layer_s": 5e-4, "eager_moe_layer_s": 5e-4, "eager_sequence_s": 1e-5, "piecewise_sequence_s": 1e-5}
#: Soft-L1 scale on log error: residuals beyond ~10% count linearly, not squared.
LOSS_SCALE = 0.1


def stage_two_models(path: str | Path | None = None) -> list[str]:
    """The models whose end-to-end jobs this (second) stage is fitted on: the split's ``fitted_on``."""
    where = Path(path or SPLIT_PATH)
    try:
        doc = json.loads(where.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ServebookError(f"cannot read the fitted/held-out split {where}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("fitted_on"), list):
        raise ServebookError(f"{where} lacks 'fitted_on' (a list of model ids)")
    return list(doc["fitted_on"])


def recorded_steps(job: dict):
    """Each recorded step of an end-to-end job: ``(chunks, decodes, mean decode context, measured s)``.

    ``chunks`` are the step's prefill chunks as ``(tokens, tokens computed before, ends its prompt)``;
    the measured time is the interval to the next step's scheduling (the last step has none and is
    left out, as are steps that scheduled nothing). Yields nothing for a job without a step log.
    """
    steps = job.get("steps") or {}
    t = steps.get("t_s") or []
    if not t or not steps.get("prefills") or None in steps.get("decode_context_tokens", [None]):
        return
    for k in range(len(t) - 1):
        decodes, ctx = steps["decodes"][k], steps["decode_context_tokens"][k]
        chunks = [(n, before, before + n >= prompt) for n, prompt, before in steps["prefills"][k]]
        if decodes or chunks:
            yield chunks, decodes, (ctx / decodes if decodes else 0.0), t[k + 1] - t[k]


def term_models(path: str | Path | None = None) -> dict[str, list[str]]:
    """``{coefficient: [model ids]}``: the later stages' terms and the models each was fitted on
    (``term_models`` of the split file; empty when it names none)."""
    where = Path(path or SPLIT_PATH)
    try:
        doc = json.loads(where.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ServebookError(f"cannot read the fitted/held-out split {where}: {exc}") from None
    terms = doc.get("term_models") or {}
    if not isinstance(terms, dict) or not all(isinstance(v, list) for v in terms.values()):
        raise ServebookError(f"{where}: 'term_models' must map a coefficient to a list of model ids")
    return {k: list(v) for k, v in terms.items()}


def fitted_models(path: str | Path | None = None) -> list[str]:
    """Every model whose measurements shaped a term of the step model, so whose jobs are "fitted", never
    held out: the second stage's (:func:`stage_two_models`) and each later term's (:func:`term_models`)."""
    out = stage_two_models(path)
    for models in term_models(path).values():
        out += [m for m in models if m not in out]
    return out


@functools.lru_cache(maxsize=None)
def _reference_config_sha(model_id: str) -> str | None:
    """sha256 of a reference model's config (shipped data), None for an id that names none."""
    from servebook.errors import ConfigError
    from servebook.hf_config import load_reference_config
    from servebook.provenance import config_sha256

    try:
        return config_sha256(load_reference_config(model_id))
    except ConfigError:
        return None


def fitted_shape(doc: dict, fitted: list[str]) -> bool:
    """Whether a record is of a model the step model was fitted on: by its id, or by its config being
    one of theirs (another run of that model -- with simulated routing, say -- is not held out). An id
    that names no reference model matches by id only."""
    if doc["model_id"] in fitted:
        return True
    shas = {_reference_config_sha(m) for m in fitted} - {None}  # an id of no reference model: by id only
    return doc.get("config_sha256") in shas


def routes_as_priced(record: dict, spec) -> bool:
    """Whether a record's engine routed MoE tokens as the step model prices them (uniformly at random):
    always for a dense model; for an MoE only under vLLM's uniform-random routing simulation. An MoE on
    random weights left to its own router can send a batch to far fewer experts (the fits leave such
    records out; they stay in ``labs/results`` as measured). ``spec``: the record's ModelSpec."""
    from servebook.vllm_rules.moe import routes_uniformly

    return spec.moe is None or routes_uniformly(record.get("environment"))


def fit_records(docs: list[dict], fitted: list[str]) -> list[dict]:
    """The end-to-end records this stage fits on: a fitted model's shape, one GPU (TP 1), and the
    routing the step model prices (:func:`routes_as_priced`)."""
    from servebook.hf_config import load_model_spec

    return [doc for doc in docs
            if int(doc["engine_args"].get("tensor_parallel_size") or 1) == 1 and fitted_shape(doc, fitted)
            and routes_as_priced(doc, load_model_spec(doc["config"], name=doc["model_id"]))]


def _step_rows(docs: list[dict], fitted: list[str], gpu, coeffs):
    """Per step that vLLM does not replay as one full CUDA graph (a prefill chunk, or more decoding sequences
    than the largest graph), of the fitted models' jobs: the arrays ``step_seconds`` takes
    (each step's :meth:`StepPricer.formula_args`), and ``measured`` (seconds)."""
    import numpy as np

    from servebook.hf_config import load_model_spec
    from servebook.perf.model import StepPricer
    from servebook.perf.work import NO_WORK, PrefillWork, decode_work
    from servebook.vllm_rules.compilation import cudagraph_max_tokens

    args: list[dict] = []
    measured_s: list[float] = []
    for doc in fit_records(docs, fitted):
        spec = load_model_spec(doc["config"], name=doc["model_id"])
        flags = doc["engine_args"]
        graph = cudagraph_max_tokens(int(flags["max_num_seqs"]), int(flags["max_num_batched_tokens"]),
                                     enforce_eager=bool(flags.get("enforce_eager")), architecture=spec.architecture)
        prefill = PrefillWork(spec)
        pricer = StepPricer(spec, gpu, coeffs, cudagraph_max_tokens=graph,
                            kv_cache_dtype=flags.get("kv_cache_dtype") or "auto")
        for job in doc["jobs"]:
            for chunks, decodes, ctx, measured in recorded_steps(job):
                if measured <= 0 or (not chunks and decodes <= graph):  # a full-graph decode step: stage one's
                    continue
                w = list(decode_work(spec, decodes, ctx).astuple()) if decodes else list(NO_WORK)
                for n, before, last in chunks:
                    w = [a + b for a, b in zip(w, prefill(n, before, last))]
                args.append(pricer.formula_args(*w))
                measured_s.append(measured)
    rows = {k: np.asarray([a[k] for a in args], dtype=bool if k in ("eager", "piecewise") else float)
            for k in (args[0] if args else ()) if k != "tp"}
    rows["measured"] = np.asarray(measured_s, dtype=float)
    return rows


def record_source(path: Path, doc: dict, root: Path | None = None) -> dict:
    """Provenance of one end-to-end record a fit used: file (relative to ``root``), sha256, model, date,
    vLLM version."""
    rel = str(path.relative_to(root)) if root and path.is_relative_to(root) else str(path)
    return {"file": rel, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "model": doc["model_id"],
            "date": doc.get("date"), "vllm_version": doc.get("vllm_version")}


def e2e_sources(paths: list[Path], fitted: list[str], root: Path | None = None) -> list[dict]:
    """:func:`record_source` of each record :func:`fit_records` keeps, with its steps that carried a prefill."""
    out = []
    for p in paths:
        doc = json.loads(p.read_text())
        if fit_records([doc], fitted):
            out.append(record_source(p, doc, root)
                       | {"steps_with_prefill": sum(1 for j in doc.get("jobs", []) for c, *_ in recorded_steps(j) if c)})
    return out


def fit_host_terms(coeffs, sweep_features, docs: list[dict], fitted: list[str], gpu):
    """``coeffs`` with :data:`FITTED` refitted (see the module docstring); the rest unchanged.

    ``sweep_features``: the first stage's ``_Features`` of its calibration points (their predictions
    enter the fit); ``docs``: ``servebook.e2e/1`` records; ``fitted``: the model ids whose jobs count.
    Returns ``(coefficients, report)`` with the number of steps used and their median log error
    before and after. Raises ServebookError when no fitted model has a step with a prefill chunk.
    """
    from dataclasses import replace

    import numpy as np
    from scipy.optimize import least_squares

    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import step_seconds

    g = gpu_numbers(gpu)
    rows = _step_rows(docs, fitted, g, coeffs)
    if not len(rows["measured"]):
        raise ServebookError(f"no recorded step with a prefill chunk among the fitted models {fitted}; "
                             "record their end-to-end jobs (servebook.lab.e2e.job) first")
    args = {k: v for k, v in rows.items() if k != "measured"}

    def with_terms(x):
        return replace(coeffs, **{f: float(v) for f, v in zip(FITTED, np.exp(x))})

    def soft_l1(r):  # residuals whose squares sum to the soft-L1 loss
        s = LOSS_SCALE
        return np.sign(r) * s * np.sqrt(2.0 * (np.sqrt(1.0 + (r / s) ** 2) - 1.0))

    def residuals(x):
        c = with_terms(x)
        steps = np.log(step_seconds(g, c, tp=1, **args)["step_s"]) - np.log(rows["measured"])
        sweep = np.log(sweep_features.predict(c)) - np.log(sweep_features.measured)
        return np.concatenate([soft_l1(steps) / np.sqrt(len(steps)), soft_l1(sweep) / np.sqrt(len(sweep))])

    lo = np.log([_BOUNDS[f][0] for f in FITTED])
    hi = np.log([_BOUNDS[f][1] for f in FITTED])
    x0 = np.clip(np.log([_START[f] for f in FITTED]), lo + 1e-9, hi - 1e-9)
    res = least_squares(residuals, x0, bounds=(lo, hi), max_nfev=2000)
    fitted_coeffs = with_terms(res.x)

    def median_log_error(c):
        return float(np.median(np.log(step_seconds(g, c, tp=1, **args)["step_s"]) - np.log(rows["measured"])))

    report = {"steps": int(len(rows["measured"])), "models": sorted(set(fitted)),
              "median_log_error_before": median_log_error(coeffs), "median_log_error_after": median_log_error(fitted_coeffs),
              "loss": f"soft_l1 on log error, scale {LOSS_SCALE}; each set weighs alike"}
    return fitted_coeffs, report


#: A step that took more than this many times its price paid something once (a one-time kernel
#: compilation, a stall): the ratio fits of calibrate_mla and calibrate_kv_fp8 leave it out.
STALL = 5.0


def measured_over_priced(groups, coeffs) -> float:
    """Measured over priced seconds, summed over the steps of ``groups`` (``(pricer, [(work, measured_s)])``
    pairs) priced with ``coeffs``; a step that took more than :data:`STALL` times its price is left out."""
    measured = priced = 0.0
    for pricer, steps in groups:
        pricer.coeffs = coeffs
        for w, m in steps:
            p = pricer.step_s(*w)
            if m <= STALL * p:
                measured += m
                priced += p
    return measured / priced
