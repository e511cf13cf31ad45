"""Latency of one ``vllm serve`` replica under an arrival rate: TTFT and TPOT percentiles.

An :class:`OnlineWorkload` describes the traffic as ``vllm bench serve`` generates it with its
random dataset: requests arrive with gaps drawn from a gamma distribution of shape
``burstiness`` (1 = Poisson) at ``rate_per_s``; prompt and output lengths are uniform integers in
``[L (1 - range_ratio), L (1 + range_ratio)]``. :func:`predict_latency` serves it on the
deployment a :class:`~servebook.plan.Plan` describes, through the scheduler simulator priced by
the calibrated step model, and adds the serving path's own costs (:class:`ServingPath`: the API
server's work before a request reaches the engine and after its tokens leave it), which are
measured on real ``vllm serve`` runs (``perf/data/serving_path.json``), not assumed.

Definitions follow ``vllm bench serve``: TTFT = request sent to first token received (seconds);
TPOT of a request = (last token - first token) / (output tokens - 1) (seconds per token);
percentiles over requests.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from servebook.errors import ServebookError
from servebook.perf.model import SERVING_PATH_FILE
from servebook.reductions import numpy_or_none, percentile, require_numpy
from servebook.simulator.workload import RequestSpec

PERCENTILES = (50, 90, 99)
#: The most requests one replica's simulation draws (:meth:`OnlineWorkload.requests`).
MAX_SIMULATED_REQUESTS = 1000
#: numpy's standard exponential draws of ``default_rng(0)`` (the first :data:`MAX_SIMULATED_REQUESTS`),
#: read where numpy is missing (scripts/record_poisson_draws.py writes it; a test checks it against numpy).
POISSON_DRAWS_FILE = Path(__file__).with_name("poisson_draws.json")


@dataclass(frozen=True)
class OnlineWorkload:
    """Traffic to one deployment (all replicas together).

    Attributes:
        rate_per_s: mean arrival rate, requests per second (> 0).
        input_tokens: mean prompt length, tokens.
        output_tokens: mean output length, tokens (>= 2, so TPOT is defined).
        range_ratio: lengths are uniform in ``[L(1-r), L(1+r)]`` (0 = fixed), as ``vllm bench serve
            --random-range-ratio``.
        burstiness: shape of the gamma-distributed gaps (1 = Poisson; below 1 burstier), as
            ``vllm bench serve --burstiness``.
        prefix_tokens: leading prompt tokens the requests that carry the shared prefix (a system
            prompt) have in common, tokens.
        prefix_share: fraction of requests that carry that prefix, in [0, 1] (default 1: all). The
            carriers are spread evenly over the arrivals (request ``i`` carries it when
            ``floor((i + 1) s) > floor(i s)``), so the draws of arrivals and lengths do not depend on it.
        num_requests: requests simulated per replica; None: enough for ``duration_s`` of arrivals.
        duration_s: seconds of arrivals simulated when ``num_requests`` is None.
        seed: random seed of arrivals and lengths.
    """

    rate_per_s: float
    input_tokens: int
    output_tokens: int
    range_ratio: float = 0.0
    burstiness: float = 1.0
    prefix_tokens: int = 0
    prefix_share: float = 1.0
    num_requests: int | None = None
    duration_s: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.rate_per_s > 0 and math.isfinite(self.rate_per_s)):
            raise ServebookError(f"--rate must be a positive number of requests/s, got {self.rate_per_s}")
        if self.input_tokens < 1:
            raise ServebookError(f"--input-tokens must be >= 1, got {self.input_tokens}")
        if self.output_tokens < 2:
            raise ServebookError(f"--output-tokens must be >= 2 (TPOT needs two tokens), got {self.output_tokens}")
        if not 0 <= self.range_ratio < 1:
            raise ServebookError(f"--range-ratio must be in [0, 1), got {self.range_ratio}")
        if not self.burstiness > 0:
            raise ServebookError(f"--burstiness must be > 0 (1 = Poisson), got {self.burstiness}")
        if not 0 <= self.prefix_tokens < self.input_tokens:
            raise ServebookError(f"--prefix-tokens must be in [0, input tokens), got {self.prefix_tokens}: the shared "
                                 f"prefix is part of a prompt of about {self.input_tokens} tokens, so it must be shorter")
        if not (0.0 <= self.prefix_share <= 1.0):
            raise ServebookError(f"--prefix-share must be a fraction of requests in [0, 1], got {self.prefix_share}")

    @property
    def shares_prefix(self) -> bool:
        """Whether any request carries a shared prefix (prefix tokens > 0 and a share > 0)."""
        return self.prefix_tokens > 0 and self.prefix_share > 0

    def carries_prefix(self, i: int) -> bool:
        """Whether request ``i`` carries the shared prefix (carriers spread evenly, see ``prefix_share``)."""
        s = self.prefix_share
        return self.shares_prefix and (s >= 1.0 or math.floor((i + 1) * s) > math.floor(i * s))

    @property
    def max_request_tokens(self) -> int:
        """The longest request (prompt + output) the workload draws, tokens."""
        return (math.ceil(self.input_tokens * (1 + self.range_ratio))
                + math.ceil(self.output_tokens * (1 + self.range_ratio)))

    def requests(self, rate_per_s: float | None = None) -> list[RequestSpec]:
        """The simulated requests of one replica receiving ``rate_per_s`` (default: all of it).

        numpy draws the arrivals and lengths. Without numpy (a browser's Pyodide), Poisson traffic of
        fixed lengths on seed 0 (``servebook tune``'s defaults) reads numpy's draws from
        :data:`POISSON_DRAWS_FILE` and gives the same requests, digit for digit; other traffic needs numpy.
        """
        rate = self.rate_per_s if rate_per_s is None else rate_per_s
        n = self.num_requests or int(min(MAX_SIMULATED_REQUESTS, max(200, math.ceil(rate * self.duration_s))))
        np = numpy_or_none()
        if np is None and self._numpy_free_draws(n):
            # numpy's gamma(1, scale) is scale x its standard exponential stream (random_standard_gamma)
            scale = 1.0 / (rate * self.burstiness)
            gaps = [scale * e for e in _poisson_draws()[:n]]
            arrivals, total = [], 0.0
            for gap in gaps:      # numpy's cumsum adds in order
                total += gap
                arrivals.append(total - gaps[0])
            if n > 1 and arrivals[-1] > 0:
                factor = (n - 1) / rate / arrivals[-1]
                arrivals = [a * factor for a in arrivals]
            ins, outs = [self.input_tokens] * n, [self.output_tokens] * n
        else:
            np = require_numpy("OnlineWorkload.requests (numpy draws arrivals and lengths, except for Poisson "
                               "traffic of fixed lengths on seed 0)")
            rng = np.random.default_rng(self.seed)
            gaps = rng.gamma(self.burstiness, 1.0 / (rate * self.burstiness), size=n)
            arrivals = np.cumsum(gaps) - gaps[0]
            if n > 1 and arrivals[-1] > 0:
                # the sample's mean rate is the rate asked for (the seed's luck does not move the answer)
                arrivals = arrivals * ((n - 1) / rate / arrivals[-1])

            def lengths(mean: int, low_bound: int):
                lo = max(low_bound, int(math.floor(mean * (1 - self.range_ratio))))
                hi = max(lo, int(math.ceil(mean * (1 + self.range_ratio))))
                return rng.integers(lo, hi + 1, size=n)

            low = self.prefix_tokens + 1 if self.shares_prefix else 1
            ins, outs = lengths(self.input_tokens, low), lengths(self.output_tokens, 2)
        out = []
        for i in range(n):
            carried = self.carries_prefix(i)
            out.append(RequestSpec(f"r{i}", int(ins[i]), int(outs[i]), float(arrivals[i]),
                                   "shared" if carried else None, self.prefix_tokens if carried else 0))
        return out

    def _numpy_free_draws(self, n: int) -> bool:
        """Whether :data:`POISSON_DRAWS_FILE` holds this traffic's draws: Poisson arrivals, fixed
        lengths, seed 0, at most :data:`MAX_SIMULATED_REQUESTS` requests."""
        return (self.burstiness == 1 and self.range_ratio == 0 and self.seed == 0
                and n <= MAX_SIMULATED_REQUESTS)


@lru_cache(maxsize=1)
def _poisson_draws() -> list[float]:
    """numpy's standard exponential draws of ``default_rng(0)`` (:data:`POISSON_DRAWS_FILE`)."""
    return json.loads(POISSON_DRAWS_FILE.read_text())["draws"]


@dataclass(frozen=True)
class ServingPath:
    """What ``vllm serve``'s API server adds to the engine's own times (seconds).

    Attributes:
        ttft_s: added to every request's time to first token: HTTP, tokenizing the prompt, handing
            it to the engine, streaming the first token back (>= 0).
        tpot_s: added to every request's time per output token: detokenizing and streaming each
            token beside the engine's step (>= 0).
        source: where the numbers come from.
    """

    ttft_s: float = 0.0
    tpot_s: float = 0.0
    source: str = "none: the engine's times alone"

    def __post_init__(self) -> None:
        if self.ttft_s < 0 or self.tpot_s < 0:
            raise ServebookError("the serving path's costs are >= 0 seconds")


def _catalogue_name(gpu: str) -> str:
    """The GPU catalogue's name for ``gpu`` (``h200`` -> ``H200-SXM-141GB``)."""
    from servebook.perf.gpu import gpu_numbers

    return gpu_numbers(gpu).name


@lru_cache(maxsize=4)
def measured_serving_path(gpu: str = "h200") -> ServingPath:
    """The serving path measured on ``gpu``'s host (``perf/data/serving_path.json``); none recorded:
    :class:`ServingPath` of zeros, whose ``source`` says so."""
    if not SERVING_PATH_FILE.exists():
        return ServingPath(source="not measured yet: the engine's times alone")
    doc = json.loads(SERVING_PATH_FILE.read_text())
    row = doc.get("gpus", {}).get(_catalogue_name(gpu))
    if row is None:
        return ServingPath(source=f"not measured on {gpu}'s host: the engine's times alone")
    return ServingPath(ttft_s=row["ttft_s"], tpot_s=row["tpot_s"], source=row["source"])


def latency_band(gpu: str = "h200") -> dict[str, dict] | None:
    """The latency model's error on held-out ``vllm serve`` runs on ``gpu``'s host:
    ``{"ttft_p50": {"p10", "p90", "worst", "runs"}, ...}`` (predicted / measured - 1), or None
    when no held-out run was recorded there."""
    if not SERVING_PATH_FILE.exists():
        return None
    return json.loads(SERVING_PATH_FILE.read_text()).get("band", {}).get(_catalogue_name(gpu))


def latency_band_text(band: dict | None, gpu: str) -> str:
    """:func:`latency_band` in words, for the CLI's ``tune`` and ``simulate --rate``."""
    if not band:
        return f"no held-out vllm serve run on {gpu.upper()}: unchecked there"
    parts = [f"{m.replace('_', ' ')} {b['p10']:+.0%}..{b['p90']:+.0%}" for m, b in band.items()]
    return (f"predicted/measured - 1, 80% of {next(iter(band.values()))['runs']} held-out vllm serve runs on an "
            f"H200, vLLM 0.26.0: " + "; ".join(parts))


@dataclass(frozen=True)
class LatencyPrediction:
    """One replica's predicted latencies and throughput at ``rate_per_s``.

    ``ttft_s`` and ``tpot_s`` map a percentile (50, 90, 99) to seconds. ``prefix_hit_share`` is the
    fraction of prompt tokens served from the prefix cache (their prefill skipped by the simulated
    scheduler; 0 without a shared prefix). ``saturated`` is True when
    the replica's queue grows through the run (the last quarter of arrivals waits for its first token
    more than 1.5x as long as the second quarter, plus 0.2 s): it does not keep up, and its latencies
    grow with the length of the run.
    """

    rate_per_s: float
    ttft_s: dict[int, float]
    tpot_s: dict[int, float]
    e2e_s: dict[int, float]
    output_tokens_per_s: float
    requests_per_s: float
    mean_running: float
    peak_running: int
    preemptions: int
    saturated: bool
    num_requests: int
    serving_path: ServingPath = field(default_factory=ServingPath)
    prefix_hit_share: float = 0.0

    def to_dict(self) -> dict:
        hits = {"prefix_hit_share": self.prefix_hit_share} if self.prefix_hit_share else {}
        return {"rate_per_s": self.rate_per_s,
                **{f"ttft_p{p}_s": self.ttft_s[p] for p in PERCENTILES},
                **{f"tpot_p{p}_s": self.tpot_s[p] for p in PERCENTILES},
                **{f"e2e_p{p}_s": self.e2e_s[p] for p in PERCENTILES},
                "output_tokens_per_s": self.output_tokens_per_s, "requests_per_s": self.requests_per_s,
                "mean_running": self.mean_running, "peak_running": self.peak_running,
                "preemptions": self.preemptions, "saturated": self.saturated,
                "num_requests": self.num_requests,
                "serving_path": {"ttft_s": self.serving_path.ttft_s, "tpot_s": self.serving_path.tpot_s,
                                 "source": self.serving_path.source}} | hits


def replica_engine(plan):
    """The simulated engine of ``plan`` and its step-time model: ``(SchedulerConfig, PerfStepTime, note)``.

    The note says where the step model's coefficients come from (a GPU never measured borrows the
    measured GPU's efficiencies).
    """
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients
    from servebook.simulator.config import scheduler_config
    from servebook.simulator.step_time import perf_step_time

    if plan.gpu_name is None:
        raise ServebookError("latency needs a GPU kind (--gpu): the step model prices a GPU's steps")
    g = gpu_numbers(plan.gpu_name)
    coeffs, where = calibrated_coefficients(g.name, None)
    if plan.tp > 1 and not coeffs.tp_calibrated:
        where += "; TP all-reduce not calibrated (bandwidth term at peak link speed only, a lower bound)"
    step = perf_step_time(plan.spec, g, coeffs, tp=plan.tp, kv_cache_dtype=plan.kv_cache_dtype,
                          cudagraph_max_tokens=plan.cudagraph_max_tokens())
    return scheduler_config(plan), step, where


def predict_from_requests(requests: list[RequestSpec], config, step, *,
                          serving_path: ServingPath = ServingPath()) -> LatencyPrediction:
    """Serve ``requests`` on the simulated engine and summarise as ``vllm bench serve`` does."""
    from servebook.simulator.run import simulate

    return served_latency(simulate(requests, config, step), serving_path=serving_path)


def served_latency(result, *, serving_path: ServingPath = ServingPath()) -> LatencyPrediction:
    """A simulated run (:func:`servebook.simulator.simulate`'s result) as ``vllm bench serve`` would
    report it: the engine's TTFT and TPOT plus the serving path's, percentiles, throughput and
    whether the queue kept growing."""
    reqs = result.requests
    ttft = [r.ttft_s + serving_path.ttft_s for r in reqs]
    tpot = [(r.last_token_s - r.first_token_s) / (r.output_tokens - 1) + serving_path.tpot_s
            for r in reqs if r.output_tokens > 1]
    e2e = [r.latency_s + serving_path.ttft_s + serving_path.tpot_s * (r.output_tokens - 1) for r in reqs]
    s = result.summary()
    last_arrival = max(r.arrival_s for r in reqs)
    first = min(r.arrival_s for r in reqs)
    # falling behind shows as a queue that grows: the last quarter of arrivals waits far longer for
    # its first token than the second quarter did (the first quarter meets an empty engine)
    by_arrival = [r.ttft_s for r in sorted(reqs, key=lambda r: r.arrival_s)]
    k = max(1, len(by_arrival) // 4)
    saturated = percentile(by_arrival[-k:], 50) > 1.5 * percentile(by_arrival[k:2 * k] or by_arrival, 50) + 0.2
    return LatencyPrediction(
        rate_per_s=(len(reqs) - 1) / (last_arrival - first) if last_arrival > first else math.inf,
        ttft_s={p: percentile(ttft, p) for p in PERCENTILES},
        tpot_s={p: percentile(tpot, p) for p in PERCENTILES},
        e2e_s={p: percentile(e2e, p) for p in PERCENTILES},
        output_tokens_per_s=s["output_tokens_per_s"], requests_per_s=s["requests_per_s"],
        mean_running=s["mean_running"], peak_running=s["peak_running"], preemptions=result.num_preemptions,
        saturated=bool(saturated), num_requests=len(reqs), serving_path=serving_path,
        prefix_hit_share=sum(r.prefix_hit_tokens for r in reqs) / max(1, sum(r.prompt_tokens for r in reqs)))


def predict_latency(plan, workload: OnlineWorkload, *, replicas: int = 1,
                    serving_path: ServingPath | None = None) -> LatencyPrediction:
    """Latency percentiles of one of ``replicas`` replicas of ``plan`` sharing ``workload``'s traffic.

    Replicas behind a load balancer each see ``rate / replicas`` (a random split of Poisson
    arrivals is Poisson). ``serving_path``: default the measured one for the plan's GPU.
    """
    if replicas < 1:
        raise ServebookError(f"replicas must be >= 1, got {replicas}")
    config, step, _ = replica_engine(plan)
    path = serving_path if serving_path is not None else measured_serving_path(plan.gpu_name or "")
    return predict_from_requests(workload.requests(workload.rate_per_s / replicas), config, step,
                                 serving_path=path)
