"""Lab 9 (``labs/l9_tp_vs_dp.md``): tensor parallelism vs data parallelism on two GPUs — predictions,
replicas, combined results, and the recorded runs read back.

The lab serves one model three ways on two GPUs — one GPU (TP=1), one replica split over both
(TP=2), and two independent replicas (DP, one ``vllm serve`` per GPU pinned with
``CUDA_VISIBLE_DEVICES``) — and compares what the library predicts with what the engines log and
measure. The run side:

* :func:`predicted_configs` — per configuration: KV budget and capacity per GPU (the memory model
  and :func:`servebook.kv_cache.capacity` with the KV heads sharded over ``tp``), decode step and
  all-reduce time (the performance model), saturation throughput (:func:`servebook.perf.fleet.plan`)
  and single-stream TTFT/TPOT.
* :func:`logged_capacity` — the calculator's block and token counts from a logged
  ``Available KV cache memory`` (exact arithmetic, unlike the budget).
* :func:`split_prompts`, :func:`replica_envs`, :func:`running_replicas`, :func:`client_loads`,
  :func:`bench_replicas` — two servers, one per GPU, and the same load split between them and,
  per server, between several benchmark clients with distinct seeds.
* :func:`combine_bench_runs` — one summary over the clients' and replicas' requests (throughput
  over the span from the first start to the last end, TTFT/TPOT over all requests).
* :func:`rate_check` — the clients' decode rate beside the engines' own, and whether they agree
  within :data:`RATE_TOLERANCE` (the lab saves it in every saturation point).
* :func:`allreduce_rows` — recorded TP=1 and TP=2 decode step times side by side with the
  performance model's all-reduce term.

The recorded side (``labs/results_l9.md`` and sections 6.14/6.15): a model's configurations
(TP=1, DP=2, TP=2, TP=2+EP) may come from several result files: a run cut by its time budget
records what it skipped, and a second run with ``SERVEBOOK_LAB_L9_CONFIGS`` measures the rest
(``l9_tp_vs_dp_<model>[_<configs>]_gpu.json``). :func:`load_l9` merges them after checking that
they describe the same experiment (GPU, driver, vLLM version, model config, workload), so a table
never mixes two setups.

The saturation load of the recorded runs sends all requests at once through ``vllm bench serve``
to one ``vllm serve`` per replica. Two readings of its speed are kept apart:

* the **client's**: output tokens over the benchmark's duration, and its time per output token
  (what a user of that server saw);
* the **engine's**: ``vllm:inter_token_latency_seconds`` is timed from the engine core's own output
  timestamps (``IterationStats.update_from_output`` in 0.27.1), so its mean is the engine's time
  between a request's tokens. When every request of the load decodes at once (no more requests per
  engine than ``--max-num-seqs``, no preemption), the engine emits ``requests / mean ITL`` tokens
  per second while it decodes.

When the client's time per token is several times the engine's, the tokens were made faster than
they were delivered: the HTTP path (one API server process and one benchmark client per server in
the 2026-11-30 recordings) set the measured throughput, not the GPUs. The lab now gives each server
``api_server_count`` API processes (``--api-server-count``) and ``bench_clients`` benchmark clients
(profile parameters) and records :func:`rate_check` with every saturation point.

Units: ``*_bytes`` bytes, ``*_tokens`` tokens, ``*_s`` seconds, ``*_ms`` milliseconds, ``*_tok_s``
tokens/s, GiB where a key says so.
"""
from __future__ import annotations

import math
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servebook.errors import ServebookError
from servebook.lab.errors import LabError
from servebook.lab.recordings.engine_stats import logged_prefix_hit_pct
from servebook.lab.recordings.recorded import RECORDED_DIR, figure_title, load_recorded
from servebook.lab.harness.split import check_same_experiment, part_paths
from servebook.model_spec import ModelSpec

GIB = 2**30


# ----------------------------------------------------------------------------- predictions
@dataclass(frozen=True)
class ParallelSetup:
    """Engine settings shared by every configuration of the comparison.

    Attributes:
        gpu: catalogue name of the GPU (e.g. ``"H200"``).
        max_model_len: ``--max-model-len``, tokens.
        max_num_seqs: ``--max-num-seqs``.
        max_num_batched_tokens: ``--max-num-batched-tokens``, tokens per step.
        gpu_memory_utilization: ``--gpu-memory-utilization`` of every engine.
        enforce_eager: ``--enforce-eager`` (no CUDA graphs).
        input_len / output_len: tokens per request of the load.
        num_prompts: requests of the saturation load (split between replicas under DP).
    """

    gpu: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    enforce_eager: bool
    input_len: int
    output_len: int
    num_prompts: int


#: The configurations compared: (name, tensor-parallel size, replicas, GPUs in all).
CONFIGS = (("TP=1", 1, 1, 1), ("TP=2", 2, 1, 2), ("DP=2", 1, 2, 2))


def split_prompts(num_prompts: int, replicas: int) -> list[int]:
    """Requests per replica when ``num_prompts`` are spread evenly (the first ones get the remainder).

    >>> split_prompts(5, 2)
    [3, 2]
    """
    if replicas < 1 or num_prompts < replicas:
        raise LabError(f"cannot split {num_prompts} requests over {replicas} replicas; "
                       "use at least one request per replica")
    base, extra = divmod(num_prompts, replicas)
    return [base + (1 if i < extra else 0) for i in range(replicas)]


def predicted_configs(spec: ModelSpec, setup: ParallelSetup, coeffs) -> list[dict]:
    """What the library predicts for TP=1, TP=2 and two TP=1 replicas (one row per configuration).

    Each row: ``config``, ``tp``, ``replicas``, ``gpus``; per GPU ``weights_gib``,
    ``available_kv_bytes`` (memory model), ``kv_bytes_per_token`` (KV heads sharded over ``tp``),
    ``num_gpu_blocks``, ``kv_cache_tokens`` and ``max_concurrency`` (the engine's two log lines);
    ``tokens_in_kv_all_replicas`` (what the whole deployment holds); ``decode_step_s`` and
    ``allreduce_s`` for one decode step at ``max_num_seqs`` sequences of mean context
    ``input_len + output_len / 2``; ``single_stream_ttft_s`` (one prompt alone) and
    ``single_stream_tpot_s`` (a batch-1 decode step); ``output_tokens_per_s`` at saturation for
    ``num_prompts`` requests (all replicas together, :func:`servebook.perf.fleet.plan`).
    """
    from servebook.kv_cache import capacity
    from servebook.memory import memory_budget, weights_bytes_per_gpu
    from servebook.perf.fleet import Deployment, LengthDistribution, Workload, plan
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import cudagraph_max_tokens, decode_step, prefill_request_s

    g = gpu_numbers(setup.gpu)
    graph_max = cudagraph_max_tokens(setup.max_num_seqs, setup.max_num_batched_tokens,
                                     enforce_eager=setup.enforce_eager)
    context = setup.input_len + setup.output_len / 2
    workload = Workload(setup.num_prompts, LengthDistribution.fixed(setup.input_len),
                        LengthDistribution.fixed(setup.output_len))
    rows = []
    for name, tp, replicas, gpus in CONFIGS:
        budget = memory_budget(spec, gpu_memory_bytes=int(g.memory_bytes),
                               max_num_batched_tokens=setup.max_num_batched_tokens,
                               max_num_seqs=setup.max_num_seqs,
                               gpu_memory_utilization=setup.gpu_memory_utilization, tp=tp,
                               enforce_eager=setup.enforce_eager)
        cap = capacity(spec, budget.available_kv_bytes, max_model_len=setup.max_model_len,
                       max_num_batched_tokens=setup.max_num_batched_tokens, tp=tp, device="cuda")
        step = decode_step(spec, setup.gpu, coeffs, batch=setup.max_num_seqs, context_tokens=context, tp=tp,
                           cudagraph_max_tokens=graph_max)
        fleet = plan(workload, Deployment.of(spec, gpu=setup.gpu, gpus=gpus, name=name, tp=tp,
                                          max_num_seqs=setup.max_num_seqs,
                                          max_num_batched_tokens=setup.max_num_batched_tokens,
                                          gpu_memory_utilization=setup.gpu_memory_utilization,
                                          kv_budget_bytes_per_gpu=budget.available_kv_bytes,
                                          cudagraph_max_tokens=graph_max), coeffs)
        rows.append({
            "config": name, "tp": tp, "replicas": replicas, "gpus": gpus,
            "weights_gib": weights_bytes_per_gpu(spec, tp) / GIB,
            "available_kv_bytes": budget.available_kv_bytes,
            "available_kv_gib": budget.available_kv_bytes / GIB,
            "coefficients": budget.coefficients_status,
            "kv_bytes_per_token": cap.layout.kv_bytes_per_token,
            "block_size": cap.block_size,
            "num_gpu_blocks": cap.num_gpu_blocks,
            "kv_cache_tokens": cap.kv_cache_tokens,
            "max_concurrency": cap.max_concurrency,
            "tokens_in_kv_all_replicas": cap.kv_cache_tokens * replicas,
            "decode_batch": setup.max_num_seqs, "decode_context_tokens": context,
            "decode_step_s": step.step_s, "allreduce_s": step.allreduce_s,
            "single_stream_ttft_s": prefill_request_s(spec, setup.gpu, coeffs, prompt_tokens=setup.input_len,
                                                      max_num_batched_tokens=setup.max_num_batched_tokens, tp=tp),
            "single_stream_tpot_s": decode_step(spec, setup.gpu, coeffs, batch=1, context_tokens=context, tp=tp,
                                                cudagraph_max_tokens=graph_max).step_s,
            "fleet_batch": fleet.batch, "fleet_step_s": fleet.step_s,
            "output_tokens_per_s": fleet.output_tokens_per_s,
            "notes": list(fleet.notes),
        })
    return rows


def logged_capacity(spec: ModelSpec, available_kv_gib: float, *, tp: int, max_model_len: int,
                    max_num_batched_tokens: int) -> dict:
    """The calculator's blocks, tokens and concurrency from a logged ``Available KV cache memory`` (GiB).

    The log rounds to 0.01 GiB, so the bytes carry up to 5 MiB of rounding (a few blocks).
    """
    from servebook.kv_cache import capacity

    cap = capacity(spec, round(available_kv_gib * GIB), max_model_len=max_model_len,
                   max_num_batched_tokens=max_num_batched_tokens, tp=tp, device="cuda")
    return {"num_gpu_blocks": cap.num_gpu_blocks, "kv_cache_tokens": cap.kv_cache_tokens,
            "max_concurrency": cap.max_concurrency, "kv_bytes_per_token": cap.layout.kv_bytes_per_token}


# ----------------------------------------------------------------------------- replicas
def visible_gpus() -> int:
    """GPUs ``nvidia-smi`` lists (0 when there is no NVIDIA driver)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([l for l in out.stdout.splitlines() if l.strip()]) if out.returncode == 0 else 0


def replica_envs(env: dict, gpu_groups: Sequence[Sequence[int]]) -> list[dict]:
    """One environment per replica, each seeing only its GPUs (``CUDA_VISIBLE_DEVICES``).

    >>> [e["CUDA_VISIBLE_DEVICES"] for e in replica_envs({}, [[0], [1]])]
    ['0', '1']
    """
    seen: set[int] = set()
    out = []
    for group in gpu_groups:
        if not group or seen & set(group):
            raise LabError(f"GPU groups {list(map(list, gpu_groups))} must be non-empty and disjoint "
                           "(each replica needs GPUs of its own)")
        seen |= set(group)
        out.append(dict(env, CUDA_VISIBLE_DEVICES=",".join(map(str, group))))
    return out


@contextmanager
def running_replicas(model: str, engine_args: dict, envs: Sequence[dict], *,
                     startup_timeout_s: float = 600.0) -> Iterator[list]:
    """Start one ``vllm serve`` per environment at the same time; yield the servers; stop them all.

    The machine-wide engine lock is taken once for the group (the replicas are meant to run
    together, each on its own GPU). If any replica fails to start, the others are stopped and the
    first failure is raised (:class:`servebook.lab.errors.EngineStartError`).
    """
    from servebook.lab.harness.server import VllmServer, free_port, timed_engine_lock

    ports: list[int] = []
    while len(ports) < len(envs):
        p = free_port()
        if p not in ports:
            ports.append(p)
    servers = [VllmServer(model, engine_args, env=e, port=p, startup_timeout_s=startup_timeout_s, lock=False)
               for e, p in zip(envs, ports)]
    with timed_engine_lock():
        try:
            _each_in_a_thread(lambda i: servers[i].start(), len(servers))
            yield servers
        finally:
            for s in servers:
                s.stop()


def _each_in_a_thread(work, n: int) -> list:
    """Run ``work(i)`` for ``i`` in ``range(n)`` at once, one thread each; return the results in order.

    Waits for every thread; then re-raises the first exception (in index order) in this thread.
    """
    results: list = [None] * n
    errors: list[BaseException | None] = [None] * n

    def one(i: int) -> None:
        try:
            results[i] = work(i)
        except BaseException as exc:  # noqa: BLE001  (re-raised below in the calling thread)
            errors[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [e for e in errors if e is not None]
    if failed:
        raise failed[0]
    return results


def client_seeds(seed: int, servers: int, clients: int) -> list[list[int]]:
    """``--seed`` of each benchmark client, per server: server ``i``'s client ``c`` gets
    ``seed + i * clients + c`` (one client per server: ``seed + i``, as before clients were split).

    >>> client_seeds(0, 2, 3)
    [[0, 1, 2], [3, 4, 5]]
    """
    if servers < 1 or clients < 1:
        raise LabError(f"{servers} servers with {clients} clients each: use at least one of each")
    return [[seed + i * clients + c for c in range(clients)] for i in range(servers)]


def client_loads(num_prompts: int, servers: int, clients: int, seed: int = 0) -> list[list[tuple[int, int]]]:
    """``(seed, requests)`` of each benchmark client, per server: the requests split evenly over the
    servers (:func:`split_prompts`), each server's share evenly over its clients.

    >>> client_loads(10, 2, 2, seed=7)
    [[(7, 3), (8, 2)], [(9, 3), (10, 2)]]
    """
    seeds = client_seeds(seed, servers, clients)
    return [list(zip(seeds[i], split_prompts(n, clients)))
            for i, n in enumerate(split_prompts(num_prompts, servers))]


def bench_replicas(servers: Sequence, *, num_prompts: int, seed: int = 0, clients_per_server: int = 1,
                   **bench_kwargs) -> list[dict]:
    """Run :func:`servebook.lab.harness.run_bench` ``clients_per_server`` times on every server, all at once.

    ``num_prompts`` is split as :func:`client_loads` says, each client with its own seed, so no two
    clients send the same random prompts (:mod:`servebook.lab.harness.random_prompts` checks the starts).
    Extra keyword arguments go to every ``run_bench`` call unchanged — so a request rate or
    concurrency cap given here applies to *each* client: divide it to offer the same total load.
    Returns the runs in (server, client) order, each with ``server_index`` and ``client_index``.
    """
    from servebook.lab.harness.bench import run_bench

    jobs = [(i, c, s, n) for i, per_server in enumerate(client_loads(num_prompts, len(servers), clients_per_server,
                                                                      seed))
            for c, (s, n) in enumerate(per_server)]

    def one(k: int) -> dict:
        i, c, s, n = jobs[k]
        run = run_bench(servers[i], num_prompts=n, seed=s, **bench_kwargs)
        return dict(run, server_index=i, client_index=c)

    return _each_in_a_thread(one, len(jobs))


# ----------------------------------------------------------------------------- combined results
def request_tpot_s(request: dict) -> float | None:
    """Seconds per output token after the first (vLLM's TPOT); None for one-token outputs."""
    n = request["output_len"]
    if n < 2:
        return None
    return (request["latency_s"] - request["ttft_s"]) / (n - 1)


def run_span_s(runs: Sequence[dict]) -> float:
    """Seconds from the first run's start to the last run's end, for runs made at the same time.

    A run covers ``[first_start_s, first_start_s + duration]`` (``first_start_s`` on the host's
    monotonic clock, :func:`servebook.lab.harness.bench.run_bench`); the span is the union of those
    intervals' extent. Runs recorded without ``first_start_s`` (before clients were split) are
    taken to have started together: the span is the longest duration.
    """
    durations = [float(run["summary"]["duration"]) for run in runs]
    starts = [run.get("first_start_s") for run in runs]
    if any(start is None for start in starts):
        return max(durations)
    return max(start + d for start, d in zip(starts, durations)) - min(starts)


def combine_bench_runs(runs: Sequence[dict]) -> dict:
    """One summary over runs made at the same time: several clients, several replicas, or both.

    ``duration_s`` is :func:`run_span_s` (first start to last end); ``output_throughput`` = all
    output tokens / ``duration_s`` (tokens/s), likewise ``request_throughput`` (requests/s); TTFT
    and TPOT statistics are over every request of every run (milliseconds; percentiles by linear
    interpolation, as ``numpy.percentile``).
    """
    if not runs:
        raise LabError("no benchmark runs to combine")
    requests = [r for run in runs for r in run["requests"]]
    if not requests:
        raise LabError("the runs hold no requests")
    duration = run_span_s(runs)
    if not duration > 0:
        raise LabError(f"benchmark duration {duration!r} is not positive")
    ttft_ms = np.array([r["ttft_s"] for r in requests]) * 1e3
    tpots = [t for t in map(request_tpot_s, requests) if t is not None]
    tpot_ms = np.array(tpots) * 1e3 if tpots else np.array([math.nan])
    output_tokens = sum(r["output_len"] for r in requests)
    return {
        "runs": len(runs), "completed": len(requests), "duration_s": duration,
        "total_input_tokens": sum(r["input_len"] for r in requests),
        "total_output_tokens": output_tokens,
        "output_throughput": output_tokens / duration,
        "request_throughput": len(requests) / duration,
        "mean_ttft_ms": float(ttft_ms.mean()), "median_ttft_ms": float(np.median(ttft_ms)),
        "p99_ttft_ms": float(np.percentile(ttft_ms, 99)),
        "mean_tpot_ms": float(tpot_ms.mean()), "median_tpot_ms": float(np.median(tpot_ms)),
        "p99_tpot_ms": float(np.percentile(tpot_ms, 99)),
    }


def sum_metric_deltas(befores: Sequence[dict], afters: Sequence[dict], names: Sequence[str]) -> dict[str, float]:
    """Growth of each counter between two scrapes, summed over servers (replicas)."""
    from servebook.lab.harness.metrics import delta

    if len(befores) != len(afters):
        raise LabError("one scrape before and one after per server are needed")
    return {n: sum(delta(b, a, n) for b, a in zip(befores, afters)) for n in names}


def mean_engine_itl_s(metrics_delta: dict) -> float | None:
    """Mean seconds between a request's tokens as the engine timed them, over a load
    (``vllm:inter_token_latency_seconds`` sum / count growth); None when no gap was counted."""
    count = metrics_delta.get("vllm:inter_token_latency_seconds_count") or 0
    return metrics_delta["vllm:inter_token_latency_seconds_sum"] / count if count else None


def requests_per_server(runs: Sequence[dict]) -> list[int]:
    """Requests each server received over a load's runs (a run's ``server_index``; a run recorded
    without one, before clients were split, is a server of its own)."""
    counts: dict[int, int] = {}
    for position, run in enumerate(runs):
        key = run.get("server_index", position)
        counts[key] = counts.get(key, 0) + len(run["requests"])
    return [counts[k] for k in sorted(counts)]


def _all_decode_at_once(point: dict, max_num_seqs: int) -> bool:
    runs = point["saturated"]["runs"]
    return (not point["metrics_delta"].get("vllm:num_preemptions")
            and all(n <= max_num_seqs for n in requests_per_server(runs)))


def engine_decode_tok_s(point: dict, max_num_seqs: int) -> float | None:
    """Tokens/s the engine(s) emitted while every request of the saturation load decoded at once.

    ``requests / mean engine ITL``: ``vllm:inter_token_latency_seconds`` is timed from the engine
    core's output timestamps, so this is the engines' pace, whatever the HTTP path delivered.
    None when the condition does not hold (more requests per engine than ``max_num_seqs``, or a
    preemption), or the counters are missing.
    """
    mean_itl_s = mean_engine_itl_s(point["metrics_delta"])
    if mean_itl_s is None or not _all_decode_at_once(point, max_num_seqs):
        return None
    return sum(len(run["requests"]) for run in point["saturated"]["runs"]) / mean_itl_s


def client_decode_tok_s(point: dict, max_num_seqs: int) -> float | None:
    """Tokens/s the clients received while every request decoded at once: ``requests / mean TPOT``.

    The client's counterpart of :func:`engine_decode_tok_s` (the same requests, each request's time
    per output token after the first as the benchmark clients timed it). Not the benchmark's
    ``output_throughput``: that divides by the whole run, prefills and ramp included, so it stays
    below the decode rate even when the HTTP path keeps up. None under the same conditions.
    """
    runs = point["saturated"]["runs"]
    tpots = [t for run in runs for t in map(request_tpot_s, run["requests"]) if t is not None]
    if not tpots or not _all_decode_at_once(point, max_num_seqs):
        return None
    return sum(len(run["requests"]) for run in runs) / (sum(tpots) / len(tpots))


#: How far the clients' token rate may fall from the engines' and still measure the engines
#: (issue 26: "within 10%").
RATE_TOLERANCE = 0.10


def rate_check(point: dict, max_num_seqs: int, tolerance: float = RATE_TOLERANCE) -> dict:
    """Did the saturation load measure the engines? The clients' decode rate beside the engines'.

    Returns ``client_decode_tok_s`` (:func:`client_decode_tok_s`), ``engine_decode_tok_s``
    (:func:`engine_decode_tok_s`), ``client_over_engine`` (their ratio), ``tolerance`` and
    ``agree``: True when ``|client / engine - 1| <= tolerance``, False when not, None when either
    rate is undefined (then nothing was shown either way). Also ``servers`` and ``clients``
    (benchmark runs) of the load. Tokens/s.

    Both rates divide the same request count, so the ratio is the engines' mean ITL over the clients'
    mean TPOT: it still compares like with like when the clients did not start at the same moment.
    (The engine's mean is over gaps, the clients' over requests: equal weights when every request has
    the same output length, as with the lab's ``--ignore-eos`` and range ratio 0.)
    """
    client, engine = client_decode_tok_s(point, max_num_seqs), engine_decode_tok_s(point, max_num_seqs)
    ratio = None if client is None or engine is None else client / engine
    runs = point["saturated"]["runs"]
    return {"client_decode_tok_s": client, "engine_decode_tok_s": engine, "client_over_engine": ratio,
            "tolerance": tolerance, "agree": None if ratio is None else abs(ratio - 1) <= tolerance,
            "servers": len(requests_per_server(runs)), "clients": len(runs)}


def rate_verdict(point: dict) -> str:
    """The saved :func:`rate_check` of a saturation point in words; ``"not recorded"`` for a point
    saved before the lab made the check (the recorded 2026-11-30 files)."""
    check = point.get("saturated", {}).get("rate_check")
    if check is None:
        return "not recorded"
    if check["agree"] is None:
        return "undefined (not every request decoded at once)"
    word = "agree" if check["agree"] else "differ"
    return (f"{word}: client {check['client_decode_tok_s']:,.0f} vs engine {check['engine_decode_tok_s']:,.0f} "
            f"tok/s ({check['client_over_engine']:.2f}; +-{check['tolerance']:.0%})")


# ----------------------------------------------------------------------------- all-reduce
def _decode_points(doc: dict) -> dict[tuple[int, int], dict]:
    [case] = [c for c in doc["cases"] if c.get("result")]
    return {(p["batch"], p["prompt_tokens"]): p for p in case["result"]["decode"]}


def allreduce_rows(spec: ModelSpec, gpu: str, coeffs, tp1_doc: dict, tp2_doc: dict) -> list[dict]:
    """Recorded decode steps at TP=1 and TP=2 beside the performance model (one row per shared point).

    For each (batch, prompt) point recorded at both sizes: measured ``tp1_step_s``, ``tp2_step_s``;
    ``halving_excess_s = tp2_step_s - tp1_step_s / 2`` (what TP=2 costs beyond a perfect split:
    all-reduce plus whatever does not shrink with the GPUs, such as launch and scheduling);
    the model's ``model_tp1_step_s``, ``model_tp2_step_s``, its ``model_allreduce_s`` and
    ``model_halving_excess_s``. Documents are ``servebook.step_timing/1`` files.
    """
    from servebook.perf.model import decode_step

    one, two = _decode_points(tp1_doc), _decode_points(tp2_doc)
    rows = []
    for key in sorted(set(one) & set(two)):
        p1, p2 = one[key], two[key]
        ctx = p2["mean_context_tokens"]
        m1 = decode_step(spec, gpu, coeffs, batch=key[0], context_tokens=ctx, tp=1)
        m2 = decode_step(spec, gpu, coeffs, batch=key[0], context_tokens=ctx, tp=2)
        rows.append({
            "batch": key[0], "prompt_tokens": key[1], "mean_context_tokens": ctx,
            "tp1_step_s": p1["step_s"], "tp2_step_s": p2["step_s"],
            "halving_excess_s": p2["step_s"] - p1["step_s"] / 2,
            "model_tp1_step_s": m1.step_s, "model_tp2_step_s": m2.step_s,
            "model_allreduce_s": m2.allreduce_s,
            "model_halving_excess_s": m2.step_s - m1.step_s / 2,
        })
    if not rows:
        raise ServebookError("the two step-timing files share no (batch, prompt) decode point")
    return rows


# ----------------------------------------------------------------------------- measured vs predicted
def comparison_rows(measurements: dict, spec: ModelSpec) -> tuple[list[dict], list[str]]:
    """Measured beside predicted, one row per measured configuration of a Lab 9 result.

    ``measurements`` is the ``measurements`` dict the lab saves (``workload``, ``predicted``,
    ``points``); ``spec`` the model measured. A configuration with expert parallelism is compared
    with the prediction of its tensor-parallel size (attention and KV are split the same way).
    Returns ``(rows, notes)``: rows keyed by short column names (GiB, tokens, ms, tokens/s) and one
    note per configuration that was skipped or failed. Values a log did not print are None.
    """
    w = measurements["workload"]
    by_model = measurements["predicted"]
    if spec.name not in by_model and len(by_model) != 1:
        raise LabError(f"the result predicts {sorted(by_model)}, not {spec.name}; pass the spec of the measured model")
    predicted = by_model.get(spec.name) or next(iter(by_model.values()))
    by_name = {r["config"]: r for r in predicted}
    rows, notes = [], []
    for p in measurements["points"]:
        if "startup" not in p:
            notes.append(f"{p['config']}: not measured: {(p.get('error') or p.get('skipped') or '')[:300]}")
            continue
        tp = p["engine_args"].get("tensor_parallel_size", 1)
        pred = by_name[p["config"].split("+")[0]]
        s0 = p["startup"][0]
        gib = s0.get("available_kv_cache_gib")
        from_log = None if gib is None else logged_capacity(
            spec, gib, tp=tp, max_model_len=w["max_model_len"],
            max_num_batched_tokens=w["max_num_batched_tokens"])["kv_cache_tokens"]
        sat, light, d = p["saturated"]["summary"], p["light"]["summary"], p["metrics_delta"]
        itl_s = mean_engine_itl_s(d)
        rows.append({
            "config": p["config"],
            "KV GiB/GPU log": gib, "KV GiB pred": round(pred["available_kv_gib"], 2),
            "KV tokens log": s0.get("kv_cache_tokens"), "tokens from log GiB": from_log,
            "tokens pred": pred["kv_cache_tokens"],
            "TPOT alone ms": round(light["median_tpot_ms"], 2),
            "TPOT pred": round(pred["single_stream_tpot_s"] * 1e3, 2),
            "TTFT alone ms": round(light["median_ttft_ms"], 1),
            "TTFT pred": round(pred["single_stream_ttft_s"] * 1e3, 1),
            "out tok/s": round(sat["output_throughput"]), "tok/s pred": round(pred["output_tokens_per_s"]),
            "mean TTFT ms (saturated)": round(sat["mean_ttft_ms"]),
            "engine ITL ms (saturated)": None if itl_s is None else round(itl_s * 1e3, 2),
            "client TPOT ms (saturated)": round(sat["mean_tpot_ms"], 1),
            "engine tok/s (saturated)": None if (rate := engine_decode_tok_s(p, w["max_num_seqs"])) is None
            else round(rate),
            "preemptions": d.get("vllm:num_preemptions"),
        })
    return rows, notes


# ---------------------------------------------------------------------------
# The recorded runs: one view per model, measured beside predicted, what limited the load

#: Configurations in the order the lab measures them.
CONFIG_ORDER = ("TP=1", "DP=2", "TP=2", "TP=2+EP")


def l9_paths(model_id: str, directory: str | Path = RECORDED_DIR) -> list[Path]:
    """The recorded Lab 9 files of ``model_id`` (``l9_tp_vs_dp_<model_id>[_<configs>]_gpu.json``), sorted."""
    return part_paths(f"l9_tp_vs_dp_{model_id}", directory)


def _check_same(docs: list[dict], paths: list[Path]) -> None:
    check_same_experiment(docs, paths, measurement_keys=("workload", "setup"), what="Lab 9 files of one model",
                          hint="record the missing configurations again with the same engine and config")


def load_l9(model_id: str, directory: str | Path = RECORDED_DIR) -> dict:
    """Every recorded Lab 9 configuration of ``model_id``, merged from its result files.

    Returns ``{"doc": <earliest file's document>, "files": {config: file name},
    "measurements": {"workload", "setup", "predicted", "points"}, "not_measured": [configs]}``
    with ``points`` in :data:`CONFIG_ORDER`, one measured point per configuration (the earliest
    file's when two measured it). Raises :class:`LabError` when there is no file, when the files
    disagree on GPU, driver, release, model config or load, or when no configuration was measured.
    """
    paths = l9_paths(model_id, directory)
    if not paths:
        raise LabError(f"no Lab 9 result for {model_id} in {directory}: run "
                       f"`bash labs/tools/run_labs_gpu.sh l9-dense` or `l9-moe` on two GPUs and copy "
                       "l9_tp_vs_dp_<model>*_gpu.json there unedited")
    docs = [load_recorded(p) for p in paths]
    for doc, path in zip(docs, paths):
        if not doc["lab"].startswith(f"l9_tp_vs_dp_{model_id}"):
            raise LabError(f"{path.name} holds lab {doc['lab']!r}, not Lab 9 of {model_id}")
    order = sorted(range(len(docs)), key=lambda i: docs[i]["date"])
    docs, paths = [docs[i] for i in order], [paths[i] for i in order]
    _check_same(docs, paths)
    measured: dict[str, tuple[dict, str]] = {}
    for doc, path in zip(docs, paths):
        for point in doc["measurements"]["points"]:
            if "startup" in point and point["config"] not in measured:
                measured[point["config"]] = (point, path.name)
    unknown = sorted(set(measured) - set(CONFIG_ORDER))
    if unknown:
        raise LabError(f"Lab 9 configurations {unknown} are not among {list(CONFIG_ORDER)}")
    if not measured:
        raise LabError(f"the Lab 9 files of {model_id} measured no configuration: "
                       + "; ".join(p.get("skipped") or p.get("error", "")[:200]
                                   for d in docs for p in d["measurements"]["points"]))
    m0 = docs[0]["measurements"]
    points = [measured[c][0] for c in CONFIG_ORDER if c in measured]
    return {
        "doc": docs[0],
        "files": {c: measured[c][1] for c in CONFIG_ORDER if c in measured},
        "measurements": {"workload": m0["workload"], "setup": m0["setup"], "predicted": m0["predicted"],
                         "points": points},
        "not_measured": [c for c in CONFIG_ORDER
                         if c not in measured and any(p["config"] == c for d in docs
                                                      for p in d["measurements"]["points"])],
    }


def _point(view: dict, config: str) -> dict:
    for p in view["measurements"]["points"]:
        if p["config"] == config:
            return p
    raise LabError(f"configuration {config} was not measured (measured: {list(view['files'])})")


def saturated_prefix_hit_pct(point: dict) -> float | None:
    """The highest prefix-cache hit rate (%) a configuration's engines logged while more than one request ran.

    Random prompts should hit ~0%. Lines with one request running belong to the single-stream
    load. None when no line fell inside the saturation load (a load shorter than vLLM's 10 s
    logging interval can end between two lines).
    """
    return logged_prefix_hit_pct(point["logs"])


def metrics_prefix_hit_pct(point: dict) -> float | None:
    """Prefix-cache hits over the saturation load (%), from the ``/metrics`` counters' growth summed over
    the servers (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``, in prompt tokens).

    The reading that survives several API servers: vLLM 0.27.1 turns its periodic stats log off when
    ``--api-server-count`` is above 1, so :func:`saturated_prefix_hit_pct` finds no line then. None
    when the point has no such counters (the 2026-11-30 files) or nothing was looked up.
    """
    queries = point["metrics_delta"].get("vllm:prefix_cache_queries")
    if not queries:
        return None
    return 100 * point["metrics_delta"]["vllm:prefix_cache_hits"] / queries


def saturation_rows(view: dict) -> list[dict]:
    """Per configuration: client throughput and time per token beside the engine's, prefix hits (engine
    log and ``/metrics``), and the saved client-vs-engine verdict (:func:`rate_verdict`: "not
    recorded" for older files)."""
    w = view["measurements"]["workload"]
    rows = []
    for p in view["measurements"]["points"]:
        sat, d = p["saturated"]["summary"], p["metrics_delta"]
        itl_s = mean_engine_itl_s(d)
        itl_ms = None if itl_s is None else itl_s * 1e3
        engine = engine_decode_tok_s(p, w["max_num_seqs"])
        rows.append({
            "config": p["config"], "servers": len(requests_per_server(p["saturated"]["runs"])),
            "client out tok/s": round(sat["output_throughput"]),
            "client TPOT ms": round(sat["mean_tpot_ms"], 1),
            "engine ITL ms": None if itl_ms is None else round(itl_ms, 1),
            "client/engine": None if itl_ms is None else round(sat["mean_tpot_ms"] / itl_ms, 2),
            "engine decode tok/s": None if engine is None else round(engine),
            "prefix hits % (log)": saturated_prefix_hit_pct(p),
            "prefix hits % (/metrics)": None if (hit := metrics_prefix_hit_pct(p)) is None else round(hit, 1),
            "client vs engine": rate_verdict(p),
        })
    return rows


def measured_rows(view: dict, spec: ModelSpec) -> list[dict]:
    """Lab 9's own measured-beside-predicted rows (:func:`comparison_rows`)."""
    rows, _ = comparison_rows(view["measurements"], spec)
    return rows


def capacity_rows(view: dict, spec: ModelSpec) -> list[dict]:
    """KV budget and tokens per configuration: the engine's log, the calculator on the logged GiB, the prediction."""
    rows = measured_rows(view, spec)
    one = next((r for r in rows if r["config"] == "TP=1"), None)
    out = []
    for r in rows:
        out.append({
            "config": r["config"], "KV GiB/GPU logged": r["KV GiB/GPU log"], "KV GiB/GPU predicted": r["KV GiB pred"],
            "KV tokens logged": r["KV tokens log"], "calculator on logged GiB": r["tokens from log GiB"],
            "KV tokens predicted": r["tokens pred"],
            "logged / TP=1": None if one is None else round(r["KV tokens log"] / one["KV tokens log"], 3),
        })
    return out


def single_stream_rows(view: dict, spec: ModelSpec) -> list[dict]:
    """Time per output token and TTFT of one request at a time, measured (medians) and predicted."""
    return [{"config": r["config"], "TPOT ms": r["TPOT alone ms"], "TPOT predicted": r["TPOT pred"],
             "TTFT ms": r["TTFT alone ms"], "TTFT predicted": r["TTFT pred"]} for r in measured_rows(view, spec)]


def split_cost_ms(view: dict) -> dict:
    """What a batch-1 decode step loses to the split: TP=2 TPOT - TP=1 TPOT / 2, measured and predicted (ms)."""
    one, two = _point(view, "TP=1"), _point(view, "TP=2")
    by_name = {r["config"]: r for r in next(iter(view["measurements"]["predicted"].values()))}
    measured = two["light"]["summary"]["median_tpot_ms"] - one["light"]["summary"]["median_tpot_ms"] / 2
    predicted = (by_name["TP=2"]["single_stream_tpot_s"] - by_name["TP=1"]["single_stream_tpot_s"] / 2) * 1e3
    return {"measured_ms": measured, "predicted_ms": predicted}


def plot_l9(views: dict[str, dict]):
    """Three panels per recorded model: KV tokens per replica, single-stream TPOT, saturated tokens/s."""
    import matplotlib.pyplot as plt

    from servebook.hf_config import load_model_spec

    fig, axes = plt.subplots(len(views), 3, figsize=(11, 3.2 * len(views)), squeeze=False)
    for row, (model, view) in zip(axes, views.items()):
        spec = load_model_spec(model)
        cap, single, sat = capacity_rows(view, spec), single_stream_rows(view, spec), saturation_rows(view)
        names = [r["config"] for r in cap]
        xs = list(range(len(names)))
        _pair(row[0], xs, [r["KV tokens logged"] / 1e3 for r in cap], [r["KV tokens predicted"] / 1e3 for r in cap],
              ("engine log", "predicted"), "KV tokens per replica (thousands)")
        _pair(row[1], xs, [r["TPOT ms"] for r in single], [r["TPOT predicted"] for r in single],
              ("measured", "predicted"), "time per output token, one request (ms)")
        _pair(row[2], xs, [r["client out tok/s"] for r in sat],
              [r["engine decode tok/s"] or 0 for r in sat], ("client received", "engine emitted"),
              f"output tokens/s, {view['measurements']['workload']['num_prompts']} requests at once")
        for ax in row:
            ax.set_xticks(xs, names)
            ax.set_xlabel("configuration")
        doc = view["doc"]
        row[0].set_title(figure_title(doc, f"Lab 9 on {doc['gpu']['count']} GPUs").replace("\n", ": "),
                         fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def _pair(ax, xs, left, right, labels, ylabel) -> None:
    ax.bar([x - 0.2 for x in xs], left, 0.4, label=labels[0])
    ax.bar([x + 0.2 for x in xs], right, 0.4, label=labels[1])
    ax.set_ylabel(ylabel, fontsize=8)
    ax.legend(fontsize=7)
