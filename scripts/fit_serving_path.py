#!/usr/bin/env python3
"""Measure vllm serve's serving path and the latency model's held-out error band; write
src/servebook/perf/data/serving_path.json.

    python scripts/fit_serving_path.py           # write it
    python scripts/fit_serving_path.py --check   # exit 1 if the committed file differs

The serving path comes from the runs declared "fitted" in labs/results/serve_issue37/heldout.toml
(servebook.lab.analyses.serve_latency.fit_serving_path); the band from every run declared "held
out" in every folder of :data:`SERVE_FOLDERS` (each declared before its runs), predicted with that
path: the 10th and 90th percentiles of predicted / measured - 1 per metric, and the worst.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from servebook.lab.analyses import serve_latency as sl  # noqa: E402
from servebook.records import serve_latency_results  # noqa: E402
from servebook.reductions import percentile  # noqa: E402
from servebook.simulator.online import SERVING_PATH_FILE  # noqa: E402

#: The recorded vllm serve folders, each with its own held-out declaration; the serving path is
#: measured on the first one's fitted runs only.
SERVE_FOLDERS = ("serve_issue37", "serve_sweep37")


def build() -> dict:
    from servebook.perf.gpu import gpu_numbers

    gpu = gpu_numbers("h200").name   # every record is from one H200 (tests/test_serve_latency.py checks)
    path = sl.fit_serving_path(serve_latency_results(SERVE_FOLDERS[0]))
    held = [r for folder in SERVE_FOLDERS for r in sl.rows(serve_latency_results(folder), path)
            if r.group == "held out"]
    band = {m: {"p10": round(percentile([r.error[m] for r in held], 10), 4),
                "p90": round(percentile([r.error[m] for r in held], 90), 4),
                "worst": round(max((r.error[m] for r in held), key=abs), 4), "runs": len(held)}
            for m in sl.METRICS}
    return {"what": "vllm serve's API-server costs added to the engine's times (seconds), and the latency "
                    "model's error band on held-out runs (predicted / measured - 1). Written by "
                    "scripts/fit_serving_path.py from labs/results/" + ", ".join(SERVE_FOLDERS) + "; do not edit.",
            "gpus": {gpu: {"ttft_s": round(path.ttft_s, 6), "tpot_s": round(path.tpot_s, 6), "source": path.source}},
            "band": {gpu: band},
            "held_out_servers": sorted({r.server for r in held})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    text = json.dumps(build(), indent=1) + "\n"
    if a.check:
        same = SERVING_PATH_FILE.exists() and SERVING_PATH_FILE.read_text() == text
        print("serving_path.json is up to date" if same else "serving_path.json differs: run scripts/fit_serving_path.py")
        sys.exit(0 if same else 1)
    SERVING_PATH_FILE.write_text(text)
    print(f"wrote {SERVING_PATH_FILE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
