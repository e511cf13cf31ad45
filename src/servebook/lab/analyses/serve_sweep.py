"""`servebook tune`'s pick against a measured sweep of the same grid (issue 37, ``serve_sweep37``).

The sweep (``labs/tools/serve_sweep37.toml``) ran one ``vllm serve`` per combination of the batch
flags ``tune`` may change, each at the per-replica rates a total rate splits into over 2, 3 or 4
replicas, the way ``vllm bench sweep serve`` measures a grid. ``heldout.toml`` beside the records
declares, before the runs, the target sets, ``tune``'s picks (``tune_picks.json``) and the rule
that names the sweep's best point:

* the fewest replicas ``n`` such that some grid server, measured at ``rate / n``, meets every target
  at the set's percentile (and, as declared, kept up: request throughput at least
  :data:`KEEP_UP_SHARE` of the rate);
* among those servers, vLLM's defaults first, then fewer changed flags.

A pick *meets* when its server's run at its per-replica rate meets every target. GPU time: the
sweep's is the sum of its servers' start-up and run wall times, in seconds on the GPU; ``tune``'s is
the CPU seconds its search took on this repository's 2-core machine.
"""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

from servebook.lab.analyses.serve_latency import measured_figures

#: The declared "kept up" test: measured request throughput at least this share of the rate sent.
KEEP_UP_SHARE = 0.95
#: The flags the grid varies (the rest are vLLM's serve defaults, or fixed by the plan for every server).
GRID_FLAGS = ("max_num_seqs", "max_num_batched_tokens")


def grid_flags(doc: dict) -> dict:
    """The grid flags a server changed from vLLM's defaults, e.g. ``{"max_num_seqs": 128}``."""
    return {k: doc["engine_flags"][k] for k in GRID_FLAGS if doc["engine_flags"].get(k) is not None}


def meets(run: dict, target: dict) -> bool:
    """Whether ``run`` met every target of ``target`` at its percentile (50 or 90), in seconds."""
    q = target["percentile"]
    m = measured_figures(run)
    return m[f"ttft_p{q}"] <= target["ttft_s"] and m[f"tpot_p{q}"] <= target["tpot_s"]


def kept_up(run: dict) -> bool:
    """The declared test: ``vllm bench serve``'s request throughput >= :data:`KEEP_UP_SHARE` x the rate."""
    return run["summary"]["request_throughput"] >= KEEP_UP_SHARE * run["rate"]


def run_at(doc: dict, rate: float) -> dict | None:
    """The server's run at ``rate`` requests/s, or None."""
    return next((r for r in doc["runs"] if abs(r["rate"] - rate) < 1e-6), None)


def sweep_best(grid: list[dict], target: dict, *, keep_up: bool) -> dict | None:
    """The sweep's best point for ``target`` by the declared rule; None when no grid point qualifies.

    ``grid``: the server records of the grid. ``keep_up``: apply the declared kept-up test.
    Returns ``{"replicas", "server", "flags", "rate_per_replica", "also"}``; ``also``: the other
    servers that qualify at that rate with as few changed flags (a tie the rule does not break).
    """
    rates = sorted({r["rate"] for doc in grid for r in doc["runs"]}, reverse=True)   # fewest replicas first
    for rate in rates:
        replicas = round(target["rate"] / rate)
        ok = [doc for doc in grid
              if (run := run_at(doc, rate)) is not None and meets(run, target) and (kept_up(run) or not keep_up)]
        if ok:
            best = min(ok, key=lambda d: len(grid_flags(d)))   # defaults first, then fewer changed flags
            also = [d["name"] for d in ok if d is not best and len(grid_flags(d)) == len(grid_flags(best))]
            return {"replicas": replicas, "server": best["name"], "flags": grid_flags(best),
                    "rate_per_replica": rate, "also": also}
    return None


def pick_server(grid: list[dict], flags: dict) -> dict | None:
    """The grid server whose changed flags are exactly ``flags``."""
    return next((d for d in grid if grid_flags(d) == {k: v for k, v in flags.items() if k in GRID_FLAGS}), None)


def pick_verdict(grid: list[dict], target: dict, pick: dict | None) -> dict:
    """``tune``'s pick for ``target``, and whether its server's run at its per-replica rate met the targets."""
    if pick is None:
        return {"replicas": None, "flags": None, "meets": None, "measured": None}
    doc = pick_server(grid, pick["flags"])
    run = None if doc is None else run_at(doc, pick["rate_per_replica"])
    figures = None if run is None else measured_figures(run)
    return {"replicas": pick["replicas"], "flags": pick["flags"], "server": doc and doc["name"],
            "meets": None if run is None else meets(run, target), "measured": figures}


def read_declaration(folder: Path) -> tuple[dict, list[dict], dict]:
    """``(heldout.toml, target sets, tune_picks.json)`` of a sweep's results folder."""
    declaration = tomllib.loads((folder / "heldout.toml").read_text())
    targets = tomllib.loads((folder / "targets.toml").read_text())["target_set"]
    picks = json.loads((folder / "tune_picks.json").read_text())
    return declaration, targets, picks


def comparison(docs: list[dict], folder: Path) -> list[dict]:
    """One row per declared target set: ``tune``'s picks (default headroom and headroom 0) with their
    measured verdicts, and the sweep's best as declared (kept-up test) and without the test."""
    _, targets, picks = read_declaration(folder)
    out = []
    for t in targets:
        grid = [d for d in docs if d["config"] == t["config"]]
        chosen = picks["sets"][t["id"]]
        out.append({"id": t["id"], "target": t,
                    "tune": pick_verdict(grid, t, chosen["default_headroom"]["pick"]),
                    "tune_headroom_0": pick_verdict(grid, t, chosen["headroom_0"]["pick"]),
                    "tune_cpu_s": chosen["default_headroom"]["cpu_s"],
                    "sweep_declared": sweep_best(grid, t, keep_up=True),
                    "sweep": sweep_best(grid, t, keep_up=False)})
    return out


def sweep_gpu_seconds(docs: list[dict], config: str) -> float:
    """GPU seconds the sweep of ``config``'s grid took: start-ups plus every run's wall time."""
    return sum(d["startup_s"] + sum(r["wall_s"] for r in d["runs"]) for d in docs if d["config"] == config)


def horizon_prediction(doc: dict, rate: float, num_requests: int | None = None):
    """servebook's prediction for one replica of ``doc``'s server at ``rate`` requests/s of its
    workload: over ``num_requests`` requests (a run's own count), or, with None, over the horizon
    ``servebook tune`` sizes for (:class:`~servebook.simulator.online.OnlineWorkload`'s
    ``duration_s`` of arrivals, at most ``MAX_SIMULATED_REQUESTS`` requests)."""
    from servebook.lab.analyses.serve_latency import plan_of
    from servebook.simulator.online import OnlineWorkload, predict_latency

    w = doc["workload"]
    workload = OnlineWorkload(rate, w["input_len"], w["output_len"], range_ratio=w["range_ratio"],
                              burstiness=w.get("burstiness", 1.0), num_requests=num_requests)
    return predict_latency(plan_of(doc), workload)
