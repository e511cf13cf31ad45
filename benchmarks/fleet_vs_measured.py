"""``servebook fleet`` against the end-to-end jobs recorded on a GPU: predicted vs measured, the held-out summary, the bands.

For every job under ``labs/results/e2e/`` and ``labs/results/e2e_issue39/`` (or ``--results DIR``):
fleet's DEFAULT answer (the job with its ramp and drain, what ``servebook fleet`` prints without a flag)
for the job's own prompt and output lengths and engine flags, the measured wall time, the error
(measured / predicted seconds - 1 = predicted / measured output tokens/s - 1), and beside it fleet's
steady state alone (``--steady-state``) and the simulator's replay. Each job's group follows
``servebook.lab.e2e.bands.job_group``: held out only when no fit saw its model (``perf/data/e2e_split.json``,
the calibration's sources, the models a term was designed after) or when a ``heldout.toml`` declared it
held out before it ran. Then the held-out summary (repeats averaged, MoE jobs on a random-weight router
beside) and the error bands per regime (``perf/data/error_bands.json``, written by
``scripts/fit_error_bands.py`` from the same held-out jobs and the held-out step-timing points).

    python benchmarks/fleet_vs_measured.py [--results DIR] [--split FILE] [--gpu h200] [--json] [--steps]
    python benchmarks/fleet_vs_measured.py --declared e2e_issue39     # jobs declared before they ran
"""
from __future__ import annotations

import argparse
import json

from servebook.lab.e2e.analysis import fitted_models, in_scope, summary
from servebook.lab.e2e.bands import band_rows, held_out_summary, job_table, sources, table_rows


def _pct(x, sign: str = "+") -> str:
    return "     -" if x is None else f"{100 * x:{sign}5.0f}%"


def _declared(folder: str, gpu: str | None, as_json: bool) -> int:
    """Print every declared job: servebook fleet's default answer (ramp and drain) against the measurement."""
    from servebook.lab.e2e.analysis import declared_rows, declared_summary, read_declaration

    declaration, docs = read_declaration(folder)
    rows = declared_rows(declaration, docs, gpu=gpu)
    sums = {"held out": declared_summary(rows), "held out (stricter reading)": declared_summary(rows, strict=True),
            "held out, steady state alone": declared_summary(rows, key="steady_error")}
    if as_json:
        print(json.dumps({"rows": rows, "summary": sums}))
        return 0
    print(f"{'record':36s} {'job':12s} {'declared':9s} {'now':9s} {'strict':9s} {'meas s':>7s} {'fleet s':>7s} "
          f"{'error':>6s} {'steady':>6s}")
    for r in rows:
        head = f"{r['record']:36s} {r['job']:12s} {r['declared_group']:9s} {r['group']:9s} {r['strict_group']:9s}"
        if not r["recorded"]:
            print(f"{head}  not recorded")
            continue
        print(f"{head} {r['measured_s']:7.1f} {r['predicted_s']:7.1f} {_pct(r['error'])} {_pct(r['steady_error'])}")
    for name, s in sums.items():
        print(f"{name}: {s['jobs']} jobs, median |error| {_pct(s['median'], '')}, mean |error| {_pct(s['mae'], '')}, "
              f"worst {_pct(s['worst'])}")
    print("error = servebook fleet's default answer (the job with its ramp and drain) / measured output tokens/s - 1; "
          "steady = the steady state alone (--steady-state); now = the group after the declaration's appended "
          "[[regrouped]] entries (a held-out job whose model later shaped a term is fitted)")
    for r in rows:
        if r["regrouped_why"]:
            print(f"regrouped: {r['record']} {r['job']}: {r['regrouped_why']}")
    return 0


def _print_table(rows: list[dict]) -> None:
    """Rows of equal keys as aligned text columns (the results page shows the same rows as a table)."""
    if not rows:
        return
    width = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in rows[0]}
    print("  ".join(f"{k:{width[k]}s}" for k in rows[0]))
    for r in rows:
        print("  ".join(f"{str(v):{width[k]}s}" for k, v in r.items()))


def _bands() -> dict:
    from servebook.perf.error_bands import load_bands

    return load_bands()


def _print_bands() -> None:
    """The error bands per regime, from perf/data/error_bands.json (scripts/fit_error_bands.py)."""
    doc = _bands()
    print(f"\nheld-out error bands ({doc['error']}; {doc['band_rule']}; on {doc['gpu']}):")
    _print_table(band_rows(doc))
    for r in doc["beside"]:
        print(f"beside (in no band): {r['member']} {_pct(r['error'])} ({r['why']})")
    print("a regime not listed has no held-out measurement: fleet, step and simulate print 'no band' for it")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", help="results folder (holding e2e/) or a folder of e2e_*.json files")
    ap.add_argument("--split", help="JSON with 'fitted_on' and 'term_models' (default: servebook/perf/data/e2e_split.json): "
                                    "a job of any model either names is fitted")
    ap.add_argument("--gpu", help="catalogue GPU to predict for (default: the one each record names)")
    ap.add_argument("--json", action="store_true", help="print the rows and summaries as JSON")
    ap.add_argument("--steps", action="store_true",
                    help="also: the simulator's replay of each job and its recorded steps priced one by one")
    ap.add_argument("--declared", metavar="FOLDER",
                    help="instead: the jobs a results folder's heldout.toml declared before they ran (e.g. "
                         "e2e_issue39), each with its declared group, and the held-out summaries")
    args = ap.parse_args(argv)
    if args.declared:
        return _declared(args.declared, args.gpu, args.json)
    fitted = fitted_models(args.split)
    rows = job_table(sources(args.results), gpu=args.gpu, fitted=fitted)
    groups = {g: summary([r for r in rows if r["group"] == g]) for g in ("fitted", "held out")}
    steady = {g: summary([r for r in rows if r["group"] == g], "steady_state_error") for g in ("fitted", "held out")}
    held = held_out_summary(rows)
    if args.json:
        print(json.dumps({"rows": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
                          "summary": groups, "steady_state_summary": steady, "held_out_summary": held,
                          "bands": _bands(), "fitted_on": fitted}))
        return 0
    _print_table(table_rows(rows))
    print("fleet s / error = servebook fleet's default answer (the job with its ramp and drain); steady s / st.err = "
          "servebook fleet --steady-state; replay = the simulator's replay of the job's own requests; error = "
          "measured / predicted seconds - 1 (= predicted / measured output tokens/s - 1); route: router = an MoE on "
          "its random-weight router, not as the step model prices it")
    if args.steps:
        print(f"\n{'model':18s} {'job':18s} {'finite s':>8s} {'fin err':>7s} {'sim s':>6s} {'sim err':>7s} {'step err':>8s} {'decode':>6s} "
              f"{'mixed':>6s} {'mixed share':>11s} {'outside s':>9s}  decode-step error by batch")
        for r in rows:
            if "simulated_s" not in r:
                continue
            by_batch = " ".join(f"{b}:{_pct(v['error']).strip()}" for b, v in (r.get("steps_by_batch") or {}).items()
                                if v["steps"] >= 5)
            print(f"{r['model']:18s} {r['job']:18s} {r['finite_s']:8.1f} {_pct(r['finite_error']):>7s} "
                  f"{r['simulated_s']:6.1f} {_pct(r['sim_error']):>7s} "
                  f"{_pct(r.get('step_error')):>8s} {_pct(r.get('step_error_decode')):>6s} "
                  f"{_pct(r.get('step_error_mixed')):>6s} {_pct(r.get('mixed_share'), ''):>11s} "
                  f"{r.get('outside_steps_s', float('nan')):9.2f}  {by_batch}")
        print()
    for g in ("fitted", "held out"):
        s, st = groups[g], steady[g]
        print(f"{g:8s}: {s['jobs']} jobs, fleet's default answer: mean absolute error {_pct(s['mae'], '')}, worst "
              f"{_pct(s['worst'])}, mean {_pct(s['mean'])}; its steady state alone: MAE {_pct(st['mae'], '')}, "
              f"worst {_pct(st['worst'])}")
    for name, h in held.items():
        print(f"{name}, repeats averaged: {h['jobs']} jobs, median |error| {_pct(h['median'], '')}, mean |error| "
              f"{_pct(h['mean'], '')}, worst {_pct(h['worst'])}")
    if args.results is None:
        _print_bands()
    if args.steps:
        for g in ("fitted", "held out"):
            s = summary([r for r in rows if r["group"] == g and in_scope(r)], "finite_error")
            print(f"{g:8s}: fleet's default answer, dense models and MoE with uniform (simulated) routing only "
                  f"({s['jobs']} jobs): "
                  f"MAE {_pct(s['mae'], '')}, worst {_pct(s['worst'])}")
            s = summary([r for r in rows if r["group"] == g], "sim_error")
            print(f"{g:8s}: the simulator's replay (same step model, ramp and drain included): MAE "
                  f"{_pct(s['mae'], '')}, worst {_pct(s['worst'])}")
    routed = sorted({r["model"] for r in rows if not in_scope(r)})
    if routed:
        print(f"random router (MoE on random weights, tokens not routed uniformly): {', '.join(routed)}")
    notes = sorted({f"{r['model']}: GPU {r['gpu_source']}" for r in rows if not r["gpu_source"].startswith("recorded")})
    for n in notes:
        print(f"note: {n}")
    print(f"fitted on: {', '.join(fitted)} (servebook/perf/data/e2e_split.json); issue 20's goal for held-out "
          "jobs: MAE <= 10%, worst <= 20%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
