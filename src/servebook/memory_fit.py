"""The memory model's calibration fit: recorded start-ups -> the shipped coefficients.

:mod:`servebook.memory` computes the budget from :class:`~servebook.memory.MemoryCoefficients`;
this module makes them. Each recorded engine start-up (config, flags, log) becomes a
:class:`CalibrationRecord`; :func:`calibrate` fits the activation, non-torch and CUDA-graph
coefficients on them (non-negative least squares), :func:`leave_one_out` measures the
held-out error (:func:`shipped_leave_one_out` on the shipped start-ups, never fitting on the
declared held-out ones), and :func:`calibrate_from_fixtures` refits the shipped file from the GPU
start-ups shipped in :data:`SHIPPED_STARTUP_LOGS` (``servebook/data/startup_logs``).
Units: bytes unless a name says ``_gib`` (2**30 bytes) or ``_pct``.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from servebook.errors import ServebookError
from servebook.memory import (
    ACTIVATION_FEATURES,
    ACTIVATION_PHASES,
    GIB,
    PRIOR_COEFFICIENTS,
    MemoryBudget,
    MemoryCoefficients,
    activation_phases,
    memory_budget,
    vllm_batch_defaults,
    write_coefficients,
)
from servebook.model_spec import ModelSpec
from servebook.shipped import DATA_DIR
from servebook.shipped import STARTUP_LOGS_DIR as SHIPPED_STARTUP_LOGS  # noqa: F401 (what pages refit and check)

#: The declared held-out split (``held_out = [fixture names]``), written before the refit it guards.
FIT_SPLIT = DATA_DIR / "memory_fit_split.toml"


def held_out_names(path: str | Path | None = None) -> tuple[str, ...]:
    """Fixture names the shipped fit leaves out (:data:`FIT_SPLIT`); () when the file is absent."""
    import tomllib

    p = Path(path) if path is not None else FIT_SPLIT
    if not p.is_file():
        return ()
    try:
        names = tomllib.loads(p.read_text()).get("held_out", [])
    except tomllib.TOMLDecodeError as exc:
        raise ServebookError(f"{p} is not TOML ({exc})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ServebookError(f"{p}: held_out must be a list of fixture names")
    return tuple(names)


@dataclass(frozen=True)
class CalibrationRecord:
    """One engine start-up, reduced to what :func:`calibrate` needs.

    Attributes:
        name: where it came from (fixture folder name).
        spec: the model.
        max_num_batched_tokens / max_num_seqs / tp: the engine's settings.
        peak_activation_bytes: the torch peak (0.26: ``B GiB for peak
            activation``; 0.27.1: that figure minus the CUDA-graph estimate).
        non_torch_bytes: non-torch memory (0.26 prints it; 0.27.1: consumed
            minus weights), or None.
        cudagraph_bytes: the CUDA-graph estimate the engine subtracted
            (``Estimated CUDA graph memory``), or None when it printed none
            (eager runs, and the V2 model runner, which estimates 0).
        enforce_eager: whether the engine ran without CUDA graphs.
        gpu_memory_bytes / gpu_memory_utilization: the device total and the
            fraction, to rebuild ``requested`` (None when unknown).
        logged_available_kv_bytes: ``Available KV cache memory`` as logged.
        logged_weights_bytes: ``Model loading took X GiB`` as logged.
    """

    name: str
    spec: ModelSpec
    max_num_batched_tokens: int
    max_num_seqs: int
    tp: int
    peak_activation_bytes: float
    non_torch_bytes: float | None = None
    cudagraph_bytes: float | None = None
    enforce_eager: bool = False
    gpu_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    logged_available_kv_bytes: int | None = None
    logged_weights_bytes: int | None = None


def _nnls(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """Non-negative least squares with columns scaled to unit norm."""
    import numpy as np
    from scipy.optimize import nnls

    a = np.asarray(rows, dtype=float)
    b = np.asarray(y, dtype=float)
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale, b)
    return [float(v) for v in coef / scale]


def calibrate(
    records: Iterable[CalibrationRecord],
    *,
    prior: MemoryCoefficients | None = None,
    vllm_version: str | None = None,
    gpu: str | None = None,
) -> MemoryCoefficients:
    """Fit the activation, non-torch and CUDA-graph models to recorded start-ups.

    Activation: the peak is the larger of two phases (:func:`servebook.memory.activation_phases`),
    a max of two linear functions; the fit alternates between assigning each record to the
    phase that sets its peak under the current coefficients and a non-negative least squares
    of every peak on its phase's regressors (coefficients cannot go negative: they are copies
    of tensors), until the assignment stops changing (at most 50 rounds; the first
    assignment comes from ``prior``). Non-torch: the mean per class (TP = 1, TP > 1).
    CUDA graphs: non-negative least squares on ``[1, num_layers]`` over the
    records that logged an estimate; with a single layer count, a per-layer
    figure only (``estimate / num_layers``). A part with no data keeps the
    ``prior`` value (default :data:`PRIOR_COEFFICIENTS`, never the shipped
    file, so that a refit does not feed on its own output).

    Raises:
        ServebookError: with no records, or fewer records than activation
            features with distinct settings (the fit would be underdetermined).
    """
    recs = list(records)
    base = prior or PRIOR_COEFFICIENTS
    if not recs:
        raise ServebookError("calibrate() needs at least one start-up record")
    phases = [activation_phases(r.spec, max_num_batched_tokens=r.max_num_batched_tokens, max_num_seqs=r.max_num_seqs, tp=r.tp)
              for r in recs]
    distinct = {tuple(ph[p][k] for p in ACTIVATION_PHASES for k in ACTIVATION_FEATURES) for ph in phases}
    if len(distinct) < len(ACTIVATION_FEATURES):
        raise ServebookError(
            f"calibrate() needs start-ups with at least {len(ACTIVATION_FEATURES)} distinct "
            "model/max_num_batched_tokens/max_num_seqs settings to fit the activation model; "
            f"got {len(distinct)}"
        )
    act = _fit_phases(phases, [r.peak_activation_bytes for r in recs], base.activation)
    nt1 = [r.non_torch_bytes for r in recs if r.non_torch_bytes is not None and r.tp == 1]
    ntn = [r.non_torch_bytes for r in recs if r.non_torch_bytes is not None and r.tp > 1]
    cg = [r for r in recs if r.cudagraph_bytes is not None and r.cudagraph_bytes > 0]
    cg_const, cg_layer = base.cudagraph_constant_bytes, base.cudagraph_per_layer_bytes
    if len({r.spec.num_layers for r in cg}) >= 2:
        cg_const, cg_layer = _nnls([[1.0, float(r.spec.num_layers)] for r in cg], [r.cudagraph_bytes for r in cg])
    elif cg:
        cg_const = 0.0
        cg_layer = sum(r.cudagraph_bytes / r.spec.num_layers for r in cg) / len(cg)
    return MemoryCoefficients(
        activation=act,
        non_torch_tp1_bytes=sum(nt1) / len(nt1) if nt1 else base.non_torch_tp1_bytes,
        non_torch_tp_gt1_bytes=sum(ntn) / len(ntn) if ntn else base.non_torch_tp_gt1_bytes,
        cudagraph_constant_bytes=cg_const,
        cudagraph_per_layer_bytes=cg_layer,
        status="fitted",
        fitted_on=tuple(r.name for r in recs),
        vllm_version=vllm_version,
        gpu=gpu,
        note=_fit_note(recs, nt1, ntn, cg, vllm_version, gpu),
    )


def _active_phase(phase_rows: dict, coef) -> str:
    return max(ACTIVATION_PHASES, key=lambda p: sum(coef[k] * phase_rows[p][k] for k in ACTIVATION_FEATURES))


def _fit_phases(phases: list[dict], peaks: list[float], start) -> dict[str, float]:
    """Max-of-phases NNLS: alternate phase assignment and a joint NNLS until the assignment is stable."""
    coef = dict(start)
    assigned = None
    for _ in range(50):
        now = [_active_phase(ph, coef) for ph in phases]
        if now == assigned:
            break
        assigned = now
        rows = [[ph[p][k] for k in ACTIVATION_FEATURES] for ph, p in zip(phases, assigned)]
        coef = dict(zip(ACTIVATION_FEATURES, _nnls(rows, peaks)))
    return coef


def _fit_note(recs, nt1, ntn, cg, vllm_version, gpu) -> str:
    parts = [
        f"Fitted by servebook.memory_fit.calibrate() on {len(recs)} start-up logs"
        + (f" recorded with vLLM {vllm_version}" if vllm_version else "")
        + (f" on {gpu}" if gpu else "") + ".",
        f"Non-torch: mean of {len(nt1)} TP=1 logs"
        + (f" and {len(ntn)} TP>1 logs." if ntn else "; TP>1 keeps the prior (no TP>1 log)."),
        f"CUDA-graph estimate: {len(cg)} log(s) with 'Estimated CUDA graph memory'"
        + (" (one layer count: per-layer figure only)." if len({r.spec.num_layers for r in cg}) == 1 else "."
           if cg else "; keeps the prior."),
        "vLLM 0.27.1 sizes the KV cache with the same formula and CUDA-graph rule (see the "
        "servebook.memory docstring); its own activation peaks have not been recorded on a GPU.",
        "Refit: servebook.memory_fit.calibrate_from_fixtures(servebook.memory_fit.SHIPPED_STARTUP_LOGS, write_to=...).",
    ]
    return " ".join(parts)


def record_from_log(
    name: str,
    spec: ModelSpec,
    log,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    tp: int = 1,
    enforce_eager: bool = False,
    gpu_memory_bytes: int | None = None,
) -> CalibrationRecord:
    """Turn a parsed GPU start-up log (:class:`servebook.startup_log.StartupLog`) into a record.

    0.26.0 logs give the four claims directly (``A GiB for weight, B GiB for
    peak activation, C GiB for non-torch memory, and D GiB for CUDAGraph
    memory``; ``D`` is what capturing took *after* the KV cache was sized, so
    the record keeps the ``Estimated CUDA graph memory`` figure instead, the
    one the engine subtracted). 0.27.1 logs give "consumed (weights +
    non-torch)" and a peak that includes the CUDA-graph estimate; both are
    separated here using ``Model loading took`` and the estimate.

    Raises:
        ServebookError: when the log lacks the ``Actual usage is ...`` line
            (CPU logs, or an engine that did not finish starting).
    """
    if log.peak_activation_gib is None:
        raise ServebookError(
            f"{name}: the log has no 'Actual usage is ...' line (CPU engine or failed start); "
            "only GPU start-up logs can calibrate the memory model"
        )
    cg_est = log.cudagraph_estimated_gib
    if log.weights_gib is not None:  # 0.26.0 format
        peak = log.peak_activation_gib
        non_torch = log.non_torch_gib
    else:  # 0.27.1 format
        peak = log.peak_activation_gib - (cg_est or 0.0)
        non_torch = None
        if log.consumed_gib is not None and log.model_loading_gib is not None:
            non_torch = max(0.0, log.consumed_gib - log.model_loading_gib)
    weights = log.weights_gib if log.weights_gib is not None else log.model_loading_gib
    return CalibrationRecord(
        name=name,
        spec=spec,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        tp=tp,
        peak_activation_bytes=max(0.0, peak) * GIB,
        non_torch_bytes=None if non_torch is None else non_torch * GIB,
        cudagraph_bytes=None if cg_est is None else cg_est * GIB,
        enforce_eager=enforce_eager,
        gpu_memory_bytes=gpu_memory_bytes if gpu_memory_bytes is not None else (
            round(log.total_memory_gib * GIB) if log.total_memory_gib else None),
        gpu_memory_utilization=log.gpu_memory_utilization,
        logged_available_kv_bytes=log.available_kv_cache_bytes,
        logged_weights_bytes=None if weights is None else round(weights * GIB),
    )


def budget_from_log(log, *, tp: int = 1) -> MemoryBudget:
    """The four claims and the KV budget exactly as a GPU start-up log states them.

    The CUDA-graph claim is the estimate the engine subtracted (0 when the log
    has no ``Estimated CUDA graph memory`` line), not the ``D GiB for
    CUDAGraph memory`` that capturing took later.

    Raises:
        ServebookError: when the log lacks the figures (CPU logs).
    """
    if log.total_memory_gib is None or log.gpu_memory_utilization is None or log.available_kv_cache_gib is None:
        raise ServebookError("the log lacks 'Free memory on device ...' or 'Available KV cache memory'; need a GPU start-up log")
    weights = log.weights_gib if log.weights_gib is not None else (log.model_loading_gib or 0.0)
    if log.non_torch_gib is not None:
        non_torch = log.non_torch_gib
    elif log.consumed_gib is not None:
        non_torch = max(0.0, log.consumed_gib - weights)
    else:
        non_torch = 0.0
    cg = log.cudagraph_estimated_gib or 0.0
    peak = (log.peak_activation_gib or 0.0) - (cg if log.weights_gib is None else 0.0)
    return MemoryBudget(
        total_memory_bytes=round(log.total_memory_gib * GIB),
        gpu_memory_utilization=log.gpu_memory_utilization,
        requested_bytes=round((log.requested_memory_gib or 0.0) * GIB),
        weights_bytes=round(weights * GIB),
        activation_bytes=round(max(0.0, peak) * GIB),
        non_torch_bytes=round(non_torch * GIB),
        cudagraph_bytes=round(cg * GIB),
        available_kv_bytes=max(0, round(log.available_kv_cache_gib * GIB)),
        tp=tp,
        coefficients_status="logged",
    )


def records_from_fixtures(root: str | Path) -> list[CalibrationRecord]:
    """Calibration records from recorded GPU start-ups laid out as ``<root>/<name>/``.

    Each folder holds ``config.json``, ``flags.json`` (``engine_kwargs``,
    ``device``, ``usage_context``, optionally ``gpu_total_memory_bytes``) and
    ``startup.log`` (see ``tests/fixtures/startup_logs/README.md``; the GPU ones ship in
    :data:`SHIPPED_STARTUP_LOGS`). CPU folders
    and logs without the ``Actual usage is ...`` sentence are skipped. Settings
    the engine was not given explicitly take vLLM's defaults
    (:func:`vllm_batch_defaults`, the same table in 0.26.0 and 0.27.1; the
    engine caps ``max_num_seqs`` at ``max_num_batched_tokens``).
    """
    from servebook.hf_config import load_model_spec
    from servebook.startup_log import read_startup_log

    records = []
    for folder in sorted(Path(root).iterdir()):
        flags_path = folder / "flags.json"
        if not flags_path.is_file() or not (folder / "startup.log").is_file():
            continue
        flags = json.loads(flags_path.read_text())
        if flags.get("device", "cpu") == "cpu":
            continue
        log = read_startup_log(folder / "startup.log")
        if log.peak_activation_gib is None:
            continue
        kw = flags.get("engine_kwargs", {})
        total = flags.get("gpu_total_memory_bytes") or (
            round(log.total_memory_gib * GIB) if log.total_memory_gib else None
        )
        max_model_len = kw.get("max_model_len") or log.max_model_len
        default_tokens, default_seqs = vllm_batch_defaults(
            total, str(flags.get("device")), usage_context=flags.get("usage_context", "LLM_CLASS"),
            max_model_len=max_model_len,
        )
        tokens = kw.get("max_num_batched_tokens") or log.max_num_batched_tokens or default_tokens
        seqs = kw.get("max_num_seqs") or min(default_seqs, tokens)
        records.append(record_from_log(
            folder.name, load_model_spec(folder / "config.json"), log,
            max_num_batched_tokens=tokens, max_num_seqs=seqs, tp=kw.get("tensor_parallel_size", 1),
            enforce_eager=bool(kw.get("enforce_eager", False)), gpu_memory_bytes=total,
        ))
    return records


def predict_record(record: CalibrationRecord, coefficients: MemoryCoefficients) -> MemoryBudget:
    """Predict a recorded start-up's budget from its config and settings alone.

    Uses the record's GPU total, utilisation, batch settings, TP and eager flag;
    weights come from the model's shapes (``weight_bytes``), never from the log.

    Raises:
        ServebookError: when the record lacks the GPU total or utilisation.
    """
    if record.gpu_memory_bytes is None or record.gpu_memory_utilization is None:
        raise ServebookError(f"{record.name}: the record lacks the GPU total or utilisation; need a GPU start-up log")
    return memory_budget(
        record.spec,
        gpu_memory_bytes=int(record.gpu_memory_bytes),
        max_num_batched_tokens=record.max_num_batched_tokens,
        max_num_seqs=record.max_num_seqs,
        gpu_memory_utilization=record.gpu_memory_utilization,
        tp=record.tp,
        enforce_eager=record.enforce_eager,
        coefficients=coefficients,
    )


@dataclass(frozen=True)
class HeldOutError:
    """One row of :func:`leave_one_out`: a start-up predicted by a fit that never saw it.

    Attributes:
        name: fixture name.
        predicted: the predicted budget (weights from the config).
        logged_available_kv_bytes: ``Available KV cache memory`` as logged.
        logged_weights_bytes: ``Model loading took`` as logged.
        logged_activation_bytes: the peak the log states.
    """

    name: str
    predicted: MemoryBudget
    logged_available_kv_bytes: int
    logged_weights_bytes: int | None
    logged_activation_bytes: float

    @property
    def available_error_pct(self) -> float:
        """(predicted - logged) / logged x 100 for ``Available KV cache memory``."""
        return 100.0 * (self.predicted.available_kv_bytes - self.logged_available_kv_bytes) / self.logged_available_kv_bytes

    @property
    def weights_error_pct(self) -> float | None:
        """(predicted - logged) / logged x 100 for the weights, or None."""
        if not self.logged_weights_bytes:
            return None
        return 100.0 * (self.predicted.weights_bytes - self.logged_weights_bytes) / self.logged_weights_bytes


def leave_one_out(records: Sequence[CalibrationRecord], *, held_out: Iterable[str] = ()) -> list[HeldOutError]:
    """For each record, fit on all the others except the held-out ones and predict it (:func:`predict_record`).

    The honest error of the model on a start-up it was not fitted to: a row's prediction
    comes from :func:`calibrate` on every record except itself and except the names in
    ``held_out``. A held-out record is still predicted, by the fit on all non-held-out
    records, i.e. the fit :func:`calibrate_from_fixtures` ships. Held-out start-ups enter
    no fit at all: they are declared (:func:`held_out_names`) as out-of-sample checks of the
    shipped fit, so letting them into any other record's fit would let a check move the
    figures it is checking against (recording one moved another record's prediction).
    Records without a logged ``Available KV cache memory`` are fitted on but not predicted.
    Errors are in percent of the logged figures (:class:`HeldOutError`); budgets in bytes.
    Use :func:`shipped_leave_one_out` for the shipped start-ups and their declared split.

    Raises:
        ServebookError: a held-out name that is not one of ``records``.
    """
    excluded = set(held_out)
    unknown = sorted(excluded - {r.name for r in records})
    if unknown:
        raise ServebookError(f"held-out start-ups not among the records: {', '.join(unknown)}")
    shipped_fit = None  # the fit on every non-held-out record, shared by the held-out rows
    rows = []
    for i, held in enumerate(records):
        if held.logged_available_kv_bytes is None:
            continue
        if held.name in excluded:
            if shipped_fit is None:
                shipped_fit = calibrate([r for r in records if r.name not in excluded])
            fit = shipped_fit
        else:
            fit = calibrate([r for j, r in enumerate(records) if j != i and r.name not in excluded])
        rows.append(HeldOutError(
            name=held.name,
            predicted=predict_record(held, fit),
            logged_available_kv_bytes=held.logged_available_kv_bytes,
            logged_weights_bytes=held.logged_weights_bytes,
            logged_activation_bytes=held.peak_activation_bytes,
        ))
    return rows


def shipped_leave_one_out() -> list[HeldOutError]:
    """:func:`leave_one_out` over the shipped start-ups (:data:`SHIPPED_STARTUP_LOGS`) with the declared split.

    The declared held-out start-ups (:func:`held_out_names`, from :data:`FIT_SPLIT`) enter no
    fit; each is predicted by the shipped fit, every other start-up by the fit on the rest
    minus the held-out ones. What every page, notebook and test that reports leave-one-out
    errors on the shipped start-ups calls. A declared name not yet recorded (declared before
    its device call) excludes nothing.
    """
    records = records_from_fixtures(SHIPPED_STARTUP_LOGS)
    recorded = {r.name for r in records}
    return leave_one_out(records, held_out=[n for n in held_out_names() if n in recorded])


def calibrate_from_fixtures(
    root: str | Path, *, write_to: str | Path | None = None, held_out: Iterable[str] | None = None,
) -> MemoryCoefficients:
    """Fit coefficients on every GPU fixture under ``root`` except the held-out ones; optionally write them as JSON.

    ``held_out``: fixture names left out of the fit (default: for the shipped folder
    :data:`SHIPPED_STARTUP_LOGS`, :func:`held_out_names`, the declared split; for any other
    folder, none). The fitted file records the fixture
    names it was fitted on, the held-out ones, the vLLM version(s) and GPU(s) of the logs, so
    the book can say what its memory figures rest on.

    Raises:
        ServebookError: a held-out name that is not a fixture under ``root``.
    """
    recs = records_from_fixtures(root)
    if held_out is None:
        held_out = held_out_names() if Path(root).resolve() == Path(SHIPPED_STARTUP_LOGS).resolve() else ()
    out = tuple(held_out)
    unknown = sorted(set(out) - {r.name for r in recs})
    if unknown:
        raise ServebookError(f"held-out start-ups not found under {root}: {', '.join(unknown)}")
    recs = [r for r in recs if r.name not in out]
    versions, gpus = set(), set()
    for name in (r.name for r in recs):
        flags = json.loads((Path(root) / name / "flags.json").read_text())
        versions.add(str(flags.get("vllm_version")))
        gpus.add(str(flags.get("device")))
    fitted = calibrate(recs, vllm_version=", ".join(sorted(versions)), gpu=", ".join(sorted(gpus)))
    if out:
        from dataclasses import replace

        fitted = replace(fitted, note=fitted.note + f" Held out (declared in memory_fit_split.toml before the fit): {', '.join(out)}.")
    if write_to is not None:
        write_coefficients(fitted, write_to)
    return fitted
