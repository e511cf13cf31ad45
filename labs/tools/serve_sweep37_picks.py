#!/usr/bin/env python3
"""The picks `servebook tune` makes for the target sets of labs/results/serve_sweep37/heldout.toml.

Run on a CPU machine, before the sweep is recorded (the picks are declared with the runs):
    PYTHONPATH=src python labs/tools/serve_sweep37_picks.py > labs/results/serve_sweep37/tune_picks.json

Each set: Mistral-7B (v0.1), 72 requests/s of the plan's workload, at most 4 H200s at TP 1, KV auto,
the grid the sweep measures (--max-num-seqs {default, 128} x --max-num-batched-tokens {default, 2048}),
once with tune's default headroom and once with --headroom 0. ``cpu_s`` is the search's time here.
"""
import json
import platform
import sys
import time
import tomllib
from pathlib import Path

from servebook.simulator.online import OnlineWorkload
from servebook.simulator.tune import LatencyTargets, tune

ROOT = Path(__file__).resolve().parents[2]
DECLARATION = ROOT / "labs" / "results" / "serve_sweep37" / "targets.toml"


def pick(target: dict, headroom):
    t0 = time.process_time()
    w = OnlineWorkload(target["rate"], 1024, 256, range_ratio=0.5)
    r = tune(ROOT / target["config"], gpu="h200", max_gpus=4, workload=w,
             targets=LatencyTargets(target["ttft_s"], target["tpot_s"], percentile=target["percentile"],
                                    headroom=headroom),
             tps=(1,), kv_cache_dtypes=("auto",), max_model_len=2048,
             max_num_seqs_choices=(None, 128), max_num_batched_tokens_choices=(None, 2048))
    cpu = time.process_time() - t0
    b = r.best
    if b is None:
        return {"cpu_s": cpu, "pick": None, "binding": r.binding}
    flags = {f: getattr(b.plan, f) for f in b.changed_flags}
    return {"cpu_s": cpu, "candidates_tried": len(r.tried),
            "pick": {"replicas": b.replicas, "flags": flags, "rate_per_replica": target["rate"] / b.replicas,
                     "serve_command": b.serve_command(),
                     "predicted": {"ttft_s": dict(b.prediction.ttft_s), "tpot_s": dict(b.prediction.tpot_s)}}}


def main() -> None:
    sets = tomllib.loads(DECLARATION.read_text())["target_set"]
    out = {"schema": "servebook.tune_picks/1", "machine": f"{platform.machine()}, {platform.processor() or '?'}",
           "python": sys.version.split()[0], "sets": {}}
    for t in sets:
        out["sets"][t["id"]] = {"default_headroom": pick(t, None), "headroom_0": pick(t, 0.0)}
    print(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
