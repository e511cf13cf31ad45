"""Search the cheapest deployment that meets latency targets: ``servebook tune``.

Inputs: a model, a GPU kind and how many of them may be used, the traffic
(:class:`~servebook.simulator.online.OnlineWorkload`), the targets (:class:`LatencyTargets`: TTFT,
TPOT and/or end-to-end latency at one percentile) and optionally a price per GPU-hour.

Every candidate is one :class:`~servebook.plan.Plan` (TP, KV cache dtype, ``--max-num-seqs``,
``--max-num-batched-tokens``) served by ``R`` replicas, each receiving ``rate / R``; its
latencies come from :func:`~servebook.simulator.online.predict_latency`. Cost is GPUs x price, so
the search walks GPU counts upward and stops at the first count where some candidate meets every
target: that count is the cheapest. Within it, vLLM's defaults are tried first and a flag is
changed only when the defaults miss (ties go to fewer changed flags, then to the larger margin).
When nothing within the GPUs meets the targets, :attr:`TuneResult.binding` says which target
binds and what would relax it.

Prefix caching: when the workload carries a shared prefix (``prefix_tokens`` x ``prefix_share``),
every candidate is simulated with vLLM's default (on in 0.32.0,
:data:`~servebook.vllm_rules.DEFAULT_ENABLE_PREFIX_CACHING`): the scheduler simulator finds the
cached blocks and schedules only the prompt tokens after them, so the prefill the hits save shortens
steps, TTFT and queues. Caching off (``--no-enable-prefix-caching``) is simulated for the pick
and reported beside it (it joins the candidates tried), not at every shape: in the simulator it
can only lose (hits remove prefill work, and cached blocks stay evictable, so they never cost
capacity), and each try is a whole simulation. Sliding-window models' hits are not simulated (a
note says so): their predictions price every prompt token.

Speculative decoding (``speculative``, a :class:`~servebook.perf.speculative.SpeculativeAsk`) is
not searched: the simulator emits one token per request per step and cannot price verification
steps, per-step acceptance or the drafts' KV slots. The result's notes carry what the step model
alone says of it at the pick's mean batch (:func:`speculation_note`), and no pick carries it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from servebook.errors import ServebookError
from servebook.simulator.online import LatencyPrediction, OnlineWorkload, ServingPath, measured_serving_path
from servebook.vllm_rules import DEFAULT_ENABLE_PREFIX_CACHING

#: Alternatives to vLLM's defaults the search tries (None = the default of the release).
MAX_NUM_SEQS_CHOICES = (None, 128, 32)
MAX_NUM_BATCHED_TOKENS_CHOICES = (None, 2048, 16384)
KV_CACHE_DTYPES = ("auto", "fp8")
#: A default configuration that misses a target by more than this factor is not retried with other
#: batch flags (they move a percentile by tens of percent, not by factors): more GPUs are the remedy.
MAX_MISS_FLAGS_FIX = 2.0
TP_CHOICES = (1, 2, 4, 8)

#: What to watch once deployed: vLLM's own metrics (names checked against the release by the drift test).
WATCH = (
    ("vllm:time_to_first_token_seconds", "its p90 against the TTFT target; a rise at steady traffic means queueing"),
    ("vllm:inter_token_latency_seconds", "its p90 against the TPOT target; spikes follow long prompts' chunks"),
    ("vllm:num_requests_waiting", "should stay near 0; a queue that grows means the replicas are saturated"),
    ("vllm:kv_cache_usage_perc", "near 1.0 means the KV cache binds the batch; preemptions follow"),
    ("vllm:num_preemptions", "should not grow; each one recomputes a request's prompt"),
)


#: Until held-out ``vllm serve`` runs measure the latency model's error band, a prediction must beat
#: a target by the accuracy the model is held to (issue 37's goal: 15% at p50, 25% at p90 and p99),
#: so that a pick whose prediction errs by that much still meets the target when deployed.
GOAL_HEADROOM = {50: 0.15, 90: 0.25, 99: 0.25}


@dataclass(frozen=True)
class LatencyTargets:
    """Targets at one percentile (50, 90 or 99), seconds; None = no target on that figure.

    ``headroom``: a candidate meets a target when its prediction x (1 + headroom) is within it
    (default: :data:`GOAL_HEADROOM` for the percentile; 0 trusts the prediction exactly).
    """

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    percentile: int = 90
    headroom: float | None = None

    @property
    def factor(self) -> float:
        """1 + the headroom in force."""
        return 1.0 + (GOAL_HEADROOM[self.percentile] if self.headroom is None else self.headroom)

    def __post_init__(self) -> None:
        if self.percentile not in (50, 90, 99):
            raise ServebookError(f"--percentile must be 50, 90 or 99, got {self.percentile}")
        given = [v for v in (self.ttft_s, self.tpot_s, self.e2e_s) if v is not None]
        if not given:
            raise ServebookError("give at least one target: --ttft-ms, --tpot-ms or --e2e-s")
        if any(not (v > 0 and math.isfinite(v)) for v in given):
            raise ServebookError("latency targets must be positive numbers")
        if self.headroom is not None and not 0 <= self.headroom < 10:
            raise ServebookError(f"--headroom must be in [0, 10), got {self.headroom}")

    def misses(self, p: LatencyPrediction) -> dict[str, float]:
        """``{figure: predicted / target}`` for each target the prediction misses (ratio > 1)."""
        q = self.percentile
        out = {}
        for name, target, value in (("ttft", self.ttft_s, p.ttft_s[q]), ("tpot", self.tpot_s, p.tpot_s[q]),
                                     ("e2e", self.e2e_s, p.e2e_s[q])):
            if target is not None and (value * self.factor > target or p.saturated):
                out[name] = value * self.factor / target
        return out

    def margin(self, p: LatencyPrediction) -> float:
        """The smallest target / predicted ratio (> 1 = headroom)."""
        q = self.percentile
        pairs = [(self.ttft_s, p.ttft_s[q]), (self.tpot_s, p.tpot_s[q]), (self.e2e_s, p.e2e_s[q])]
        return min(t / max(v * self.factor, 1e-12) for t, v in pairs if t is not None)


@dataclass(frozen=True)
class Candidate:
    """One deployment tried: ``replicas`` x the plan's TP GPUs, and its predicted latencies per replica."""

    plan: object
    replicas: int
    prediction: LatencyPrediction
    changed_flags: tuple[str, ...]
    misses: dict[str, float] = field(default_factory=dict)
    prefix_caching: bool = DEFAULT_ENABLE_PREFIX_CACHING

    @property
    def changes(self) -> int:
        """How many settings differ from vLLM's defaults (batch flags, KV dtype, prefix caching)."""
        return (len(self.changed_flags) + (self.plan.kv_cache_dtype != "auto")
                + (self.prefix_caching != DEFAULT_ENABLE_PREFIX_CACHING))

    @property
    def gpus(self) -> int:
        return self.replicas * self.plan.tp

    @property
    def meets(self) -> bool:
        return not self.misses

    @property
    def output_tokens_per_s_per_gpu(self) -> float:
        return self.prediction.output_tokens_per_s / self.plan.tp

    def serve_command(self) -> str:
        """The ``vllm serve`` line of one replica (flags of the release the book describes)."""
        import shlex

        p = self.plan
        args = ["vllm", "serve", p.model_ref, "--tensor-parallel-size", str(p.tp),
                "--max-model-len", str(p.max_model_len)]
        if "max_num_seqs" in self.changed_flags:
            args += ["--max-num-seqs", str(p.max_num_seqs)]
        if "max_num_batched_tokens" in self.changed_flags:
            args += ["--max-num-batched-tokens", str(p.max_num_batched_tokens)]
        if p.kv_cache_dtype != "auto":
            args += ["--kv-cache-dtype", p.kv_cache_dtype]
        if self.prefix_caching != DEFAULT_ENABLE_PREFIX_CACHING:
            args.append("--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching")
        return shlex.join(args)

    def to_dict(self) -> dict:
        p = self.plan
        return {"tp": p.tp, "replicas": self.replicas, "gpus": self.gpus, "kv_cache_dtype": p.kv_cache_dtype,
                "max_num_seqs": p.max_num_seqs, "max_num_batched_tokens": p.max_num_batched_tokens,
                "max_model_len": p.max_model_len, "changed_flags": list(self.changed_flags),
                "prefix_caching": self.prefix_caching,
                "meets": self.meets, "misses": self.misses,
                "output_tokens_per_s_per_gpu": self.output_tokens_per_s_per_gpu,
                "serve_command": self.serve_command(), "prediction": self.prediction.to_dict()}


@dataclass(frozen=True)
class TuneResult:
    """The search's answer: the cheapest candidate meeting the targets (None if none), every
    candidate tried, the Pareto frontier, and, when nothing meets, what binds."""

    best: Candidate | None
    tried: tuple[Candidate, ...]
    targets: LatencyTargets
    workload: OnlineWorkload
    gpu: str
    max_gpus: int
    price_per_gpu_hour: float | None
    binding: str = ""
    notes: tuple[str, ...] = ()

    def frontier(self) -> list[Candidate]:
        """Candidates that keep up (not saturated, TTFT within its target when one is set) and that no
        other such candidate beats on both output tokens/s per GPU (higher) and the target
        percentile's TPOT (lower); by throughput per GPU, descending. Of candidates with the same
        figures, the one with the fewest changed flags stands for all."""
        q = self.targets.percentile
        pts = [c for c in self.tried if not c.prediction.saturated and "ttft" not in c.misses]
        pts.sort(key=lambda c: c.changes)
        seen, unique = set(), []
        for c in pts:
            key = (c.gpus, c.plan.tp, round(c.output_tokens_per_s_per_gpu), round(c.prediction.tpot_s[q] * 1e4))
            if key not in seen:
                seen.add(key)
                unique.append(c)
        out = [c for c in unique if not any(
            o.output_tokens_per_s_per_gpu >= c.output_tokens_per_s_per_gpu and o.prediction.tpot_s[q] <= c.prediction.tpot_s[q]
            and (o.output_tokens_per_s_per_gpu > c.output_tokens_per_s_per_gpu or o.prediction.tpot_s[q] < c.prediction.tpot_s[q])
            for o in unique)]
        return sorted(out, key=lambda c: -c.output_tokens_per_s_per_gpu)

    def flags_text(self, c: Candidate) -> str:
        """The candidate's changed flags with their values, e.g. ``--max-num-seqs 128, fp8 KV``."""
        parts = [f"--{f.replace('_', '-')} {getattr(c.plan, f)}" for f in c.changed_flags]
        if c.plan.kv_cache_dtype != "auto":
            parts.append(f"{c.plan.kv_cache_dtype} KV")
        if c.prefix_caching != DEFAULT_ENABLE_PREFIX_CACHING:
            parts.append("prefix caching " + ("on" if c.prefix_caching else "off"))
        return ", ".join(parts) or "defaults"

    def binding_one_gpu_fewer(self) -> tuple[str, ...]:
        """The targets that bind the pick: what the closest candidate on one GPU fewer misses
        (``("tpot",)``, ...); empty when the pick is one GPU or nothing met the targets."""
        if self.best is None:
            return ()
        fewer = [c for c in self.tried if c.gpus == self.best.gpus - 1]
        if not fewer:
            return ()
        closest = min(fewer, key=lambda c: max(c.misses.values()))
        return tuple(sorted(closest.misses))

    def binding_one_gpu_fewer_text(self) -> str:
        """:meth:`binding_one_gpu_fewer` in words (``"TPOT"``, ``"TTFT and TPOT"``; ``"none"``)."""
        return " and ".join(TARGET_NAMES[m] for m in self.binding_one_gpu_fewer()) or "none"

    def cost_per_hour(self, c: Candidate) -> float | None:
        return None if self.price_per_gpu_hour is None else c.gpus * self.price_per_gpu_hour

    def cost_per_million_output_tokens(self, c: Candidate) -> float | None:
        """Price of a million output tokens at the offered rate (all replicas), currency units."""
        if self.price_per_gpu_hour is None:
            return None
        tokens_per_hour = c.prediction.output_tokens_per_s * c.replicas * 3600.0
        return self.cost_per_hour(c) / tokens_per_hour * 1e6


def _flags(max_num_seqs, max_num_batched_tokens) -> tuple[str, ...]:
    return tuple(n for n, v in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens))
                 if v is not None)


def _plans(model, gpu, tp, kv, max_model_len, usage, notes, seqs_choices=MAX_NUM_SEQS_CHOICES,
           tokens_choices=MAX_NUM_BATCHED_TOKENS_CHOICES):
    """Plans of every flag variant at (tp, kv); [] when the model does not fit that way."""
    from servebook.plan import make_plan

    out = []
    for mns in seqs_choices:
        for mnbt in tokens_choices:
            try:
                plan = make_plan(model, gpu=gpu, tp=tp, kv_cache_dtype=kv, max_model_len=max_model_len,
                                 max_num_seqs=mns, max_num_batched_tokens=mnbt, usage_context=usage)
            except ServebookError as exc:
                if mns is None and mnbt is None:
                    notes.append(f"TP {tp}, KV {kv}: {exc}")
                    return []
                continue
            if mns is not None and mns >= plan.default_max_num_seqs:
                continue
            out.append((plan, _flags(mns, mnbt)))
    return out


#: How the book and the CLI name each target metric.
TARGET_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "end-to-end"}


def default_max_model_len(workload: OnlineWorkload) -> int:
    """The engine's context a search sizes for: the workload's longest request, rounded up to a
    multiple of 1,024 tokens."""
    return 1024 * math.ceil(workload.max_request_tokens / 1024)


def tune(model, *, gpu: str, max_gpus: int, workload: OnlineWorkload, targets: LatencyTargets,
         price_per_gpu_hour: float | None = None, max_model_len: int | None = None,
         tps: tuple[int, ...] = TP_CHOICES, kv_cache_dtypes: tuple[str, ...] = KV_CACHE_DTYPES,
         serving_path: ServingPath | None = None, speculative=None,
         max_num_seqs_choices: tuple[int | None, ...] = MAX_NUM_SEQS_CHOICES,
         max_num_batched_tokens_choices: tuple[int | None, ...] = MAX_NUM_BATCHED_TOKENS_CHOICES) -> TuneResult:
    """The cheapest deployment of ``model`` on at most ``max_gpus`` ``gpu``s meeting ``targets``.

    ``max_num_seqs_choices`` / ``max_num_batched_tokens_choices``: the values of the two batch flags
    the search may try (``None``: the release's default, which must come first and is always tried
    first); the defaults are :data:`MAX_NUM_SEQS_CHOICES` and :data:`MAX_NUM_BATCHED_TOKENS_CHOICES`.
    A narrower grid prices the same configurations a measured sweep over that grid would run.

    ``max_model_len``: the engine's context (default: the workload's longest request, rounded up
    to a multiple of 1,024 tokens). ``speculative``: a :class:`~servebook.perf.speculative.SpeculativeAsk`
    (or its ``METHOD:k=K,alpha=A`` text) to report on; not searched (module docstring). See the module
    docstring for the search order.
    """
    from servebook.simulator.online import predict_from_requests, replica_engine
    from servebook.vllm_rules import check_tp
    from servebook.hf_config import load_model_spec

    import os

    if isinstance(model, os.PathLike):   # a config.json path given as a Path reads like its text
        model = os.fspath(model)
    if max_gpus < 1:
        raise ServebookError(f"--gpus must be >= 1, got {max_gpus}")
    if price_per_gpu_hour is not None and price_per_gpu_hour < 0:
        raise ServebookError(f"--price-per-gpu-hour must be >= 0, got {price_per_gpu_hour}")
    if isinstance(speculative, str):
        from servebook.perf.speculative import parse_speculative

        speculative = parse_speculative(speculative)
    if speculative is not None and speculative.draft_model is not None:
        load_model_spec(speculative.draft_model)   # an unknown draft model fails now, not after the search
    for name, choices in (("max_num_seqs", max_num_seqs_choices),
                          ("max_num_batched_tokens", max_num_batched_tokens_choices)):
        if not choices or choices[0] is not None:
            raise ServebookError(f"the {name} choices must start with None (the release's default), got {choices}")
    length = max_model_len or default_max_model_len(workload)
    spec = model if not isinstance(model, str) else load_model_spec(model)
    notes: list[str] = []
    ladders = []   # (tp, [(plan, flags)]) for each TP and KV dtype that fits
    for tp in tps:
        if tp > max_gpus:
            continue
        try:
            check_tp(spec, tp)
        except ServebookError:
            continue
        for kv in kv_cache_dtypes:
            try:
                plans = _plans(model, gpu, tp, kv, length, "serve", notes, max_num_seqs_choices,
                               max_num_batched_tokens_choices)
            except ServebookError as exc:   # e.g. fp8 KV on a GPU without it
                notes.append(f"TP {tp}, KV {kv}: {exc}")
                continue
            if plans:
                ladders.append((tp, plans))
    if not ladders:
        raise ServebookError(f"{getattr(spec, 'name', model)} fits no TP up to {max_gpus} {gpu} GPUs: "
                             + "; ".join(notes[:2]))
    path = serving_path if serving_path is not None else measured_serving_path(gpu)
    engines: dict[int, tuple] = {}
    tried: list[Candidate] = []
    best: Candidate | None = None

    def evaluate(plan, flags, replicas, caching: bool = DEFAULT_ENABLE_PREFIX_CACHING) -> Candidate:
        key = id(plan)
        if key not in engines:
            engines[key] = replica_engine(plan)
        config, step, _ = engines[key]
        if config.enable_prefix_caching and not caching:
            # (a sliding-window pool's config has it off already: hits are not simulated there, see the notes)
            config = replace(config, enable_prefix_caching=False)
        pred = predict_from_requests(workload.requests(workload.rate_per_s / replicas), config, step,
                                     serving_path=path)
        c = Candidate(plan, replicas, pred, flags, targets.misses(pred), caching)
        tried.append(c)
        return c

    def caching_simulated(plan) -> bool:
        """Whether the simulator models prefix hits for ``plan`` (not for sliding-window pools)."""
        if id(plan) not in engines:
            engines[id(plan)] = replica_engine(plan)
        return engines[id(plan)][0].enable_prefix_caching

    def pick(level: list[Candidate]) -> Candidate | None:
        winners = [c for c in level if c.meets]
        return min(winners, key=lambda c: (c.changes, -targets.margin(c.prediction))) if winners else None

    for gpus in range(1, max_gpus + 1):
        shapes = [(tp, plans) for tp, plans in ladders if gpus % tp == 0]
        # first vLLM's defaults at every shape of this many GPUs; other flags only if none meets
        defaults = [(evaluate(plans[0][0], plans[0][1], gpus // tp), plans) for tp, plans in shapes]
        best = pick([c for c, _ in defaults])
        if best:
            break
        level = []
        for c, plans in defaults:
            if c.prediction.saturated or max(c.misses.values()) > MAX_MISS_FLAGS_FIX:
                # a replica that falls behind at vLLM's defaults does not catch up with a smaller
                # batch or chunk, and flags do not move a percentile by factors: more GPUs do
                continue
            for plan, flags in plans[1:]:
                if "tpot" not in c.misses and "max_num_seqs" in flags:
                    continue   # a smaller batch only lengthens queues: it helps TPOT, never TTFT
                level.append(evaluate(plan, flags, c.replicas))
        best = pick(level)
        if best:
            break
    binding = "" if best else _binding(tried, targets, max_gpus, gpu, workload, path)
    if best is not None:
        # where the pick's step times come from (a TP > 1 pick rests on an all-reduce term that is a lower bound)
        notes.append(f"step model: {engines[id(best.plan)][2]}")
    if workload.shares_prefix:
        notes.append(_prefix_note(best, workload, targets, caching_simulated, evaluate))
    if speculative is not None:
        notes.append(speculation_note(best, speculative, workload))
    return TuneResult(best, tuple(tried), targets, workload, gpu, max_gpus, price_per_gpu_hour, binding,
                      tuple(notes) + ((f"serving path: {path.source}",) if path.source else ()))


def _floors(c: Candidate, workload: OnlineWorkload, path: ServingPath) -> dict[str, float]:
    """What no load can beat on ``c``'s engine: a lone mean prompt's TTFT and a lone request's TPOT (s)."""
    from servebook.simulator.online import replica_engine

    _, step, _ = replica_engine(c.plan)
    prefill = step.step_s([(workload.input_tokens, 0, True)], [])
    decode = step.step_s([], [workload.input_tokens])
    return {"ttft": prefill + path.ttft_s, "tpot": decode + path.tpot_s,
            "e2e": prefill + path.ttft_s + (decode + path.tpot_s) * (workload.output_tokens - 1)}


def _binding(tried: list[Candidate], targets: LatencyTargets, max_gpus: int, gpu: str,
             workload: OnlineWorkload, path: ServingPath) -> str:
    """Which target binds when nothing met them, and what would relax it."""
    q = targets.percentile
    names = {m: f"{TARGET_NAMES[m]} latency" if m == "e2e" else TARGET_NAMES[m] for m in TARGET_NAMES}
    goal = {"ttft": targets.ttft_s, "tpot": targets.tpot_s, "e2e": targets.e2e_s}
    fastest = max(tried, key=lambda c: c.plan.tp)
    floors = _floors(fastest, workload, path)
    for name, target in goal.items():
        if target is not None and floors[name] * targets.factor > target:
            return (f"p{q} {names[name]} binds at any load: a lone request already takes {floors[name] * 1e3:.1f} ms "
                    f"at TP {fastest.plan.tp} on {gpu.upper()} ({floors[name] * targets.factor * 1e3:.1f} ms with the "
                    f"{targets.factor - 1:.0%} allowance), above the {target * 1e3:.1f} ms target. Relax it to at "
                    f"least {floors[name] * targets.factor * 1e3:.1f} ms, or use a faster GPU or a higher TP")
    widest = [c for c in tried if c.gpus == max(t.gpus for t in tried)]
    if all(c.prediction.saturated for c in widest):
        return (f"capacity binds: no configuration on {max_gpus} {gpu.upper()} keeps up with "
                f"{workload.rate_per_s:g} requests/s (every one falls behind). Give more GPUs (--gpus) or lower the rate")
    closest = min(tried, key=lambda c: max(c.misses.values()))
    worst = max(closest.misses, key=closest.misses.get)
    value = {"ttft": closest.prediction.ttft_s, "tpot": closest.prediction.tpot_s, "e2e": closest.prediction.e2e_s}[worst][q]
    where = f"TP {closest.plan.tp} x {closest.replicas} replica(s)"
    return (f"p{q} {names[worst]} binds: the closest candidate, {where}, is predicted at {value * 1e3:.0f} ms "
            f"({value * targets.factor * 1e3:.0f} ms with the {targets.factor - 1:.0%} allowance) against "
            f"{goal[worst] * 1e3:.0f} ms. Relax that target to {value * targets.factor * 1e3:.0f} ms, or give more "
            f"GPUs (--gpus)")


def _prefix_note(best: Candidate | None, workload: OnlineWorkload, targets: LatencyTargets, caching_simulated,
                 evaluate) -> str:
    """What prefix caching did for the pick: its hit share, and the pick's latencies with the other setting."""
    shared = (f"a {workload.prefix_tokens:,}-token shared prefix on {workload.prefix_share:.0%} of requests")
    if best is None:
        return f"prefix caching: {shared}; nothing met the targets with it on (vLLM's default)"
    if not caching_simulated(best.plan):
        return (f"prefix caching: {shared}; vLLM 0.32.0 caches prefixes for this model too, but the simulator does "
                "not model hits in sliding-window KV groups, so every prompt token's prefill is priced: TTFT and "
                "the GPU count are upper bounds for this workload")
    other = evaluate(best.plan, best.changed_flags, best.replicas, not best.prefix_caching)
    q = targets.percentile
    on, off = (best, other) if best.prefix_caching else (other, best)
    return (f"prefix caching: {shared}; with caching on {on.prediction.prefix_hit_share:.0%} of prompt tokens hit the "
            f"cache (their prefill skipped); this deployment's p{q} TTFT {_ms(on.prediction.ttft_s[q])} with it on, "
            f"{_ms(off.prediction.ttft_s[q])} with --no-enable-prefix-caching (p{q} TPOT {_ms(on.prediction.tpot_s[q])} "
            f"vs {_ms(off.prediction.tpot_s[q])}; off {'meets' if off.meets else 'misses'} the targets)")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def speculation_note(best: Candidate | None, ask, workload: OnlineWorkload) -> str:
    """Speculative decoding as asked (``ask``: :class:`~servebook.perf.speculative.SpeculativeAsk`): why it is
    not searched, and what the step model alone prices for one decode step of the pick's mean batch."""
    from servebook.hf_config import load_model_spec
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients
    from servebook.perf.speculative import Drafter, break_even_acceptance, speculative_step
    from servebook.vllm_rules import async_scheduling_with_speculation

    head = (f"speculative decoding ({ask.text()}) is not searched: the scheduler simulator emits one token per "
            "request per step, so it cannot price verification steps, per-step acceptance or the drafts' KV slots; "
            "no pick carries it")
    if best is None:
        return head
    plan = best.plan
    g = gpu_numbers(plan.gpu_name)
    coeffs, _ = calibrated_coefficients(g.name, None)
    batch = max(1, round(best.prediction.mean_running))
    context = workload.input_tokens + workload.output_tokens / 2
    drafter = (Drafter() if ask.method == "ngram"
               else Drafter("draft_model", spec=load_model_spec(ask.draft_model), tp=plan.tp))
    kw = dict(k=ask.k, batch=batch, context_tokens=context, drafter=drafter, tp=plan.tp,
              kv_cache_dtype=plan.kv_cache_dtype)
    s = speculative_step(plan.spec, g, coeffs, alpha=ask.alpha, **kw)
    even = break_even_acceptance(plan.spec, g, coeffs, **kw)
    sync = "" if async_scheduling_with_speculation(ask.method) else (
        f"; with {ask.method} vLLM 0.32.0 also turns async scheduling off, a cost not priced here")
    return (f"{head}. The step model alone prices a decode step of the pick's mean batch ({batch} running, "
            f"{context:,.0f}-token context) at {s.step_s * 1e3:.1f} ms for {s.tokens_per_step:.2f} tokens per request "
            f"against {s.plain_step_s * 1e3:.1f} ms for 1: x{s.speedup:.2f} decode throughput "
            f"({'it would pay' if s.speedup > 1 else 'it would slow decoding'}; break-even acceptance "
            f"{'none up to 1' if even is None else f'{even:.2f}'}){sync}")
