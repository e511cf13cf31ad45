"""Issue 39's step-time terms switched on and off, against the declared end-to-end jobs.

Two terms were fitted on end-to-end jobs (``perf/data/calibration.json``, stages 4 and 5):
``eager_mla_layer_s`` (host time an MLA layer adds to an eager step; off = 0) and
``fp8_kv_bandwidth_eff`` (the KV bandwidth an fp8 cache is read at, as a fraction of the 16-bit one;
off = 1). :func:`declared_ablation` prices every job of each declaration
(``labs/results/<folder>/heldout.toml``) as ``servebook fleet``'s default answer under each combination.
The calibration is swapped by pointing ``$SERVEBOOK_PERF_CALIBRATION`` at a copy with the terms switched
off, for the duration of :func:`terms_switched_off` only.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

#: Each term and its value when switched off (the step model without it).
TERMS = {"eager_mla_layer_s": 0.0, "fp8_kv_bandwidth_eff": 1.0}


def variants() -> list[tuple[str, dict]]:
    """``(name, {term: off value})``: neither new term, each alone, both (the shipped calibration)."""
    out = [("neither", dict(TERMS))]
    out += [(f"{n} only", {m: v for m, v in TERMS.items() if m != n}) for n in TERMS]
    out.append(("both", {}))
    return out


@contextlib.contextmanager
def terms_switched_off(off: dict):
    """Within the block, the step model prices with the shipped calibration but ``off`` (``{term: value}``)."""
    from servebook.perf.model import Coefficients, load_calibration

    record = load_calibration()
    for gpu, entry in record["coefficients"].items():
        record["coefficients"][gpu] = replace(Coefficients.from_dict(entry), **off).to_dict()
    before = os.environ.get("SERVEBOOK_PERF_CALIBRATION")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "calibration.json"
        path.write_text(json.dumps(record))
        os.environ["SERVEBOOK_PERF_CALIBRATION"] = str(path)
        try:
            yield
        finally:
            if before is None:
                del os.environ["SERVEBOOK_PERF_CALIBRATION"]
            else:
                os.environ["SERVEBOOK_PERF_CALIBRATION"] = before


def declared_ablation(folders: list[str]) -> list[dict]:
    """One row per declared job of ``folders``: ``folder``, ``record``, ``model``, ``job``, ``group`` (now),
    ``declared_group``, ``recorded`` and ``errors`` (``{variant: error}``, predicted / measured output
    tokens/s - 1 of servebook fleet's default answer; None where not recorded)."""
    from servebook.lab.e2e.analysis import declared_rows, read_declaration

    rows: list[dict] = []
    for name, off in variants():
        with terms_switched_off(off):
            k = 0
            for folder in folders:
                declaration, docs = read_declaration(folder)
                for r in declared_rows(declaration, docs):
                    if len(rows) <= k:
                        rows.append({"folder": folder, "record": r["record"], "model": r["model"], "job": r["job"],
                                     "kind": r["kind"], "group": r["group"], "declared_group": r["declared_group"],
                                     "recorded": r["recorded"], "errors": {}})
                    rows[k]["errors"][name] = r["error"]
                    k += 1
    return rows


def ablation_summary(rows: list[dict], group: str) -> dict:
    """``{variant: {"jobs", "mae", "median", "worst"}}`` over the recorded rows of ``group`` (now)."""
    import statistics

    out = {}
    for name, _ in variants():
        errs = [r["errors"][name] for r in rows if r["group"] == group and r["recorded"]]
        out[name] = ({"jobs": len(errs), "mae": statistics.fmean(abs(e) for e in errs),
                      "median": statistics.median(abs(e) for e in errs), "worst": max(errs, key=abs)}
                     if errs else {"jobs": 0, "mae": None, "median": None, "worst": None})
    return out
