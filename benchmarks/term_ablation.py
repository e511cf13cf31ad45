"""Issue 39's step-time terms switched on and off: servebook fleet's error on every recorded job.

The terms (``eager_mla_layer_s``, off = 0; ``fp8_kv_bandwidth_eff``, off = 1) and how they are switched:
:mod:`servebook.lab.e2e.ablation`. Printed, for neither term, each alone and both (the shipped calibration):

* every job of each declaration (``labs/results/<folder>/heldout.toml``, default ``e2e_issue39`` and
  ``e2e_issue39b``) with its group now (a declared held-out job whose model later shaped a term is fitted:
  the declaration's appended ``[[regrouped]]``); a declared job not yet recorded is listed as such;
* the mean |error| over the held-out and over the fitted jobs of all declarations;
* with ``--earlier``, the same over the earlier jobs of ``labs/results/e2e`` (fitted = a model that shaped
  any term, ``perf/data/e2e_split.json``; all of them, random-router MoE jobs included; ~2 min).

    python benchmarks/term_ablation.py [--declared e2e_issue39 e2e_issue39b] [--earlier] [--json]
"""
from __future__ import annotations

import argparse
import json

from servebook.lab.e2e.ablation import ablation_summary, declared_ablation, terms_switched_off, variants


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.0f}%"


def _cell(s: dict) -> str:
    return "0 jobs" if not s["jobs"] else f"{s['jobs']}: {100 * s['mae']:.1f}% (worst {_pct(s['worst'])})"


def earlier_summaries() -> dict:
    """``{variant: {group: summary}}`` of servebook fleet --finite-job over labs/results/e2e's jobs."""
    from servebook.lab.e2e.analysis import job_rows, fitted_models, summary
    from servebook.records import e2e_results

    out = {}
    for name, off in variants():
        with terms_switched_off(off):
            rows = [r for d in e2e_results() for r in job_rows(d, fitted=fitted_models())]
        out[name] = {g: summary([r for r in rows if r["group"] == g], "finite_error") for g in ("held out", "fitted")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--declared", nargs="+", default=["e2e_issue39", "e2e_issue39b"], metavar="FOLDER")
    ap.add_argument("--earlier", action="store_true", help="also labs/results/e2e's jobs (slow)")
    ap.add_argument("--json", action="store_true", help="print everything as JSON")
    args = ap.parse_args(argv)
    rows = declared_ablation(args.declared)
    sums = {g: ablation_summary(rows, g) for g in ("held out", "fitted")}
    earlier = earlier_summaries() if args.earlier else None
    if args.json:
        print(json.dumps({"rows": rows, "summary": sums, "earlier": earlier}))
        return 0
    names = [n for n, _ in variants()]
    print(f"{'record':36s} {'job':12s} {'declared':9s} {'now':9s} " + " ".join(f"{n:>26s}" for n in names))
    for r in rows:
        cells = " ".join(f"{_pct(r['errors'][n]) if r['recorded'] else 'not recorded':>26s}" for n in names)
        print(f"{r['record']:36s} {r['job']:12s} {r['declared_group']:9s} {r['group']:9s} {cells}")
    for g in ("held out", "fitted"):
        print(f"{'declared jobs, ' + g:69s} " + " ".join(f"{_cell(sums[g][n]):>26s}" for n in names))
    if earlier:
        for g in ("held out", "fitted"):
            print(f"{'labs/results/e2e, ' + g + ' (--finite-job)':69s} "
                  + " ".join(f"{_cell(earlier[n][g]):>26s}" for n in names))
    print("error = servebook fleet's default answer / measured output tokens/s - 1; a summary is 'jobs: mean |error|'; "
          "off = eager_mla_layer_s 0, fp8_kv_bandwidth_eff 1; both = the shipped calibration")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
