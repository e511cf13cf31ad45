#!/usr/bin/env python3
"""Record ``vllm serve`` latency under Poisson load with ``vllm bench serve``, with provenance.

Usage (on the GPU node, inside the vLLM environment, from the repository root):
    python labs/tools/serve_latency.py plan  --plan labs/tools/serve_issue37.toml
    python labs/tools/serve_latency.py run   --plan labs/tools/serve_issue37.toml --servers a,b --out $OUT

For each ``[[server]]`` of the plan: write the model directory (the reference config, dummy
weights, a word-level tokenizer that covers the model's whole vocabulary, so every sampled id
detokenizes to a word), start ``vllm serve`` (servebook's lab harness: own process group, always
torn down), send a short warm-up, then for each rate run vLLM's own benchmark client
(``vllm.benchmarks.serve``, the code behind ``vllm bench serve``, called in this process so its
~25 s of imports are paid once, not per rate) with the random dataset, Poisson arrivals,
``--ignore-eos``, and keep every request's TTFT, inter-token gaps and send time, the summary, and
the engine's ``/metrics`` before and after (its own TTFT, queue, prefill and decode histograms'
sums and counts). One JSON file per server (schema ``servebook.serve_latency/1``) is re-written
after every rate, so a call cut by its time limit returns what finished. Weights are random
(``load_format=dummy``): timing behaves as with real weights.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from servebook.provenance import config_sha256, device_info, utc_now_iso, vllm_version  # noqa: E402
from servebook.tiny_model import language_model_config, write_model_dir  # noqa: E402

SCHEMA = "servebook.serve_latency/1"
#: /metrics samples kept (their _sum and _count): the engine's own view of each request's time.
METRIC_PREFIXES = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                   "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                   "vllm:request_decode_time_seconds", "vllm:e2e_request_latency_seconds",
                   "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens",
                   "vllm:prefix_cache_queries", "vllm:prefix_cache_hits")


def load_plan(path: str) -> dict:
    plan = tomllib.loads(Path(path).read_text())
    names = [s["name"] for s in plan["server"]]
    if len(set(names)) != len(names):
        raise SystemExit(f"server names repeat in {path}")
    return plan


def prompts_for(rate: float, w: dict) -> int:
    """Prompts sent at ``rate``: about ``seconds_per_rate`` seconds of arrivals, within the bounds."""
    return int(min(w["max_prompts"], max(w["min_prompts"], round(rate * w["seconds_per_rate"]))))


def keep_metrics(values: dict) -> dict:
    return {k: v for k, v in values.items() if k.startswith(METRIC_PREFIXES)}


def bench_in_process(server, *, rate: float, num_prompts: int, w: dict, seed: int) -> dict:
    """vLLM's benchmark client (``vllm bench serve``'s ``main``) against ``server``, in this process."""
    from vllm.benchmarks.serve import add_cli_args, main
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:   # releases before the utils split
        from vllm.utils import FlexibleArgumentParser

    from servebook.lab.harness.bench import summarise_bench

    with tempfile.TemporaryDirectory(prefix="servebook-bench-") as tmp:
        argv = ["--backend", "vllm", "--base-url", server.base_url, "--model", server.model,
                "--dataset-name", "random", "--random-input-len", str(w["input_len"]),
                "--random-output-len", str(w["output_len"]), "--random-range-ratio", str(w["range_ratio"]),
                "--num-prompts", str(num_prompts), "--seed", str(seed), "--ignore-eos", "--temperature", "0",
                "--request-rate", str(rate), "--burstiness", str(w.get("burstiness", 1.0)),
                "--save-result", "--save-detailed", "--result-dir", tmp, "--result-filename", "bench.json"]
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        args = parser.parse_args(argv)
        t0 = time.monotonic()
        main(args)
        wall = time.monotonic() - t0
        raw = json.loads((Path(tmp) / "bench.json").read_text())
    out = summarise_bench(raw, command=["vllm", "bench", "serve", *argv], wall_s=wall)
    # every inter-token gap, to the microsecond (the file stays well under the 16 MiB a result may take)
    out["itls_s"] = [[round(g, 6) for g in gaps] for gaps in raw.get("itls") or []]
    return out


def run_server(spec: dict, plan: dict, out_dir: Path, deadline: float) -> None:
    from servebook.lab.harness.server import VllmServer

    w = plan["workload"]
    engine = {**plan.get("engine", {}), **spec.get("flags", {})}
    cfg_path = ROOT / spec["config"]
    config = language_model_config(json.loads(cfg_path.read_text()))
    env = {**os.environ, **{k: str(v) for k, v in spec.get("env", {}).items()}}
    doc = {"schema": SCHEMA, "name": spec["name"], "model": spec["model"], "config": spec["config"],
           "config_sha256": config_sha256(config), "vllm_version": vllm_version(), "device": device_info(),
           "recorded": utc_now_iso(), "engine_flags": engine, "environment": spec.get("env", {}),
           "workload": w, "purpose": spec.get("purpose", ""), "runs": [], "not_run": []}
    path = out_dir / f"serve_{spec['name']}.json"
    with tempfile.TemporaryDirectory(prefix="servebook-model-") as tmp:
        model_dir = write_model_dir(Path(tmp) / spec["name"], config)
        engine_args = {"load_format": "dummy", **engine}
        t0 = time.monotonic()
        with VllmServer(str(model_dir), engine_args, env=env, startup_timeout_s=420) as server:
            doc["startup_s"] = time.monotonic() - t0
            doc["serve_command"] = server.command_str()
            bench_in_process(server, rate=float(w.get("warmup_rate", 4.0)), num_prompts=int(w.get("warmup_prompts", 16)),
                             w=w, seed=1)   # warm-up: not reported
            for i, rate in enumerate(spec["rates"]):
                n = prompts_for(rate, w)
                if time.time() + n / rate + 15 > deadline:
                    doc["not_run"].append({"rate": rate, "why": "the call's deadline would pass"})
                    continue
                before = server.metrics()
                result = bench_in_process(server, rate=rate, num_prompts=n, w=w, seed=int(spec.get("seed", 37)) + i)
                after = server.metrics()
                result.update(rate=rate, num_prompts=n, metrics_before=keep_metrics(before),
                              metrics_after=keep_metrics(after))
                doc["runs"].append(result)
                s = result["summary"]
                print(f"SERVE {spec['name']} rate {rate}: n {n} ttft p50 {s['median_ttft_ms']:.1f} ms, "
                      f"tpot p50 {s['median_tpot_ms']:.2f} ms, out {s['output_throughput']:.0f} tok/s", flush=True)
                path.write_text(json.dumps(doc))
            doc["startup_log"] = server.log[-200000:]
    path.write_text(json.dumps(doc))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["plan", "run"])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--servers", default="", help="names of [[server]] entries, comma-separated (default: all)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=570, help="stop starting new rates after this")
    a = ap.parse_args()
    plan = load_plan(a.plan)
    chosen = [s for s in plan["server"] if not a.servers or s["name"] in a.servers.split(",")]
    if a.mode == "plan":
        for s in chosen:
            n = [prompts_for(r, plan["workload"]) for r in s["rates"]]
            print(s["name"], s["model"], s.get("flags", {}), list(zip(s["rates"], n)),
                  f"~{sum(k / r for k, r in zip(n, s['rates'])):.0f} s of arrivals")
        return
    deadline = time.time() + a.budget_s
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for s in chosen:
        if time.time() + 120 > deadline:
            print(f"SKIP {s['name']}: not enough time left to start it", flush=True)
            continue
        try:
            run_server(s, plan, out, deadline)
        except Exception as exc:  # noqa: BLE001  (record what failed, go on with the next server)
            print(f"FAILED {s['name']}: {type(exc).__name__}: {exc}", flush=True)
            (out / f"serve_{s['name']}.error.txt").write_text(f"{type(exc).__name__}: {exc}\n")


if __name__ == "__main__":
    main()
