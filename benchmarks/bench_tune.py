"""How long ``servebook tune`` takes on this machine (goal: under 30 s on 2 cores), for the six declared
target sets of issue 37 (labs/results/serve_issue37/heldout.toml) searched as a user would type them:
every TP in 1,2,4,8 on up to 8 H200s, the KV cache dtypes and batch flags. Not a test: timings depend
on the machine. Prints one line per search and the ratio of the slowest to the goal (< 1.0 meets it).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_tune.py [--tp 1,2,4,8]``
"""
from __future__ import annotations

import argparse
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from servebook.simulator.online import OnlineWorkload  # noqa: E402
from servebook.simulator.tune import LatencyTargets, tune  # noqa: E402

GOAL_S = 30.0
CONFIGS = {"gemma-3-27b": "gemma-3-27b", "qwen2-57b-a14b": str(ROOT / "labs/tools/models/qwen2-57b-a14b.json")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", default="1,2,4,8")
    a = ap.parse_args()
    tps = tuple(int(x) for x in a.tp.split(","))
    declared = tomllib.loads((ROOT / "labs/results/serve_issue37/heldout.toml").read_text())
    worst = 0.0
    for t in declared["target_set"]:
        w = OnlineWorkload(t["rate"], 1024, 256, range_ratio=0.5)
        t0 = time.perf_counter()
        r = tune(CONFIGS[t["model"]], gpu="h200", max_gpus=8, workload=w, tps=tps,
                 targets=LatencyTargets(ttft_s=t["ttft_s"], tpot_s=t["tpot_s"], percentile=t["percentile"]))
        took = time.perf_counter() - t0
        worst = max(worst, took)
        pick = f"{r.best.replicas} x TP {r.best.plan.tp}, {r.flags_text(r.best)}" if r.best else r.binding
        print(f"{t['id']} {t['model']:<16} {t['rate']:>4} req/s: {took:5.1f} s, {len(r.tried):3} candidates -> {pick}")
    print(f"slowest search {worst:.1f} s; ratio to the {GOAL_S:.0f} s goal: {worst / GOAL_S:.2f}")


if __name__ == "__main__":
    main()
