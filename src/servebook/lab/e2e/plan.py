"""The end-to-end job plan: which models, which workloads, how many requests, and what fleet predicts.

The plan is data (``servebook/data/e2e_jobs.toml``): engine flags shared by every engine, workload
*shapes* (mean and cv of the prompt and output lengths, tokens), the models each runner target
starts (in order) and each model's jobs as ``[shape, requests]``. This module reads it, draws a
job's lengths and prompts (seeded, so a job is the same on every machine) and asks
:func:`servebook.perf.fleet.plan` what the job should take on a GPU. It needs no vLLM:
:mod:`servebook.lab.e2e.child` runs the jobs on an engine.
"""
from __future__ import annotations

import math
import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from servebook.errors import ServebookError
from servebook.shipped import E2E_JOBS

#: The shipped plan (see the module docstring).
PLAN_PATH = E2E_JOBS
#: Token ids below this are left out of prompts (special tokens of most vocabularies).
FIRST_TOKEN_ID = 100
#: Seconds an engine start takes on an H200 with CUDA graphs (measured 2026-12-01 for the e2e jobs:
#: gemma-3-27b 146 s, deepseek-v2-lite 105 s, with imports; shared/gpu/README.md said 60-90 s).
ENGINE_START_S = 130.0


@dataclass(frozen=True)
class Shape:
    """Prompt and output lengths: lognormal with these means (tokens) and cvs (std/mean; 0 = fixed)."""

    name: str
    input_mean: float
    input_cv: float
    output_mean: float
    output_cv: float


@dataclass(frozen=True)
class Job:
    """One ``LLM.generate`` call: ``requests`` requests of ``shape``, lengths and prompts drawn with ``seed``."""

    model: str
    shape: Shape
    requests: int
    seed: int
    #: Sampling temperature (0: greedy). On random weights greedy decoding can make every request emit
    #: the same tokens; sampling at 1.0 draws near-uniform random tokens instead.
    temperature: float = 0.0

    @property
    def name(self) -> str:
        base = f"{self.shape.name}-{self.requests}"
        return base if not self.temperature else f"{base}-sampled"

    def as_case(self) -> dict:
        """The job as the engine child reads it (JSON)."""
        return {"shape": vars(self.shape), "requests": self.requests, "seed": self.seed,
                "temperature": self.temperature}

    @classmethod
    def from_case(cls, model: str, case: dict) -> "Job":
        """The job :meth:`as_case` wrote (a case without ``temperature`` is greedy)."""
        return cls(model, Shape(**case["shape"]), case["requests"], case["seed"], case.get("temperature", 0.0))


@dataclass(frozen=True)
class ModelPlan:
    """A model's engine flags (vLLM names) and its jobs, run in order on one engine."""

    model: str
    kind: str
    engine_args: dict
    jobs: tuple[Job, ...] = field(default_factory=tuple)
    #: A config.json path (a test's tiny model); None: the shipped reference config of ``model``.
    config_path: str | None = None
    #: Jobs run on the same engine before the timed ones and kept apart (``warm_up_jobs`` in the record):
    #: they pay the one-time kernel compilations a job's step sizes cause (gpt-oss-20b on the H200).
    warm_up: tuple[Job, ...] = field(default_factory=tuple)
    #: The shipped reference model whose config the engine loads, when the plan's name for it differs
    #: (a second entry of the same model with other engine flags); None: ``model``.
    config_model: str | None = None
    #: Environment variables set for the engine (e.g. ``VLLM_MOE_ROUTING_SIMULATION_STRATEGY``); the
    #: record keeps every ``VLLM_*`` variable the engine saw.
    environment: dict = field(default_factory=dict)

    def config(self) -> dict:
        """The config the engine loads: ``config_path``, else the shipped reference (its text tower)."""
        import json

        from servebook.hf_config import load_reference_config
        from servebook.tiny_model import language_model_config

        if self.config_path:
            return json.loads(Path(self.config_path).read_text())
        return language_model_config(load_reference_config(self.config_model or self.model))


@dataclass(frozen=True)
class E2EPlan:
    engine_args: dict
    shapes: dict
    targets: dict
    models: dict

    def model(self, model: str) -> ModelPlan:
        if model not in self.models:
            raise ServebookError(f"no end-to-end plan for model {model!r}; use one of {', '.join(self.models)}")
        return self.models[model]

    def target_models(self, target: str) -> list[str]:
        if target not in self.targets:
            raise ServebookError(f"unknown end-to-end target {target!r}; use one of {', '.join(self.targets)}")
        return list(self.targets[target])


def _shape(name: str, raw: dict) -> Shape:
    try:
        s = Shape(name, float(raw["input_mean"]), float(raw["input_cv"]), float(raw["output_mean"]),
                  float(raw["output_cv"]))
    except KeyError as exc:
        raise ServebookError(f"shape {name!r} lacks {exc.args[0]}; give input_mean, input_cv, output_mean, "
                             "output_cv") from None
    if min(s.input_mean, s.output_mean) < 1 or min(s.input_cv, s.output_cv) < 0:
        raise ServebookError(f"shape {name!r}: means must be >= 1 token and cvs >= 0")
    return s


def load_plan(path: str | Path | None = None) -> E2EPlan:
    """Read the plan (the shipped one by default). Raises ServebookError naming a bad entry."""
    path = Path(path or PLAN_PATH)
    raw = tomllib.loads(path.read_text())
    base = dict(raw.get("engine", {}))
    shapes = {name: _shape(name, s) for name, s in raw.get("shapes", {}).items()}
    models = {}
    for i, (model, m) in enumerate(raw.get("models", {}).items()):
        # seeds: 1000 x the model's position in the plan + the job's (seed_base replaces the first term, so
        # a plan of one model can redraw the same requests as the shipped plan); warm-up jobs + 500; a
        # third element [shape, requests, seed] gives a job's seed outright (a warm-up of the very requests)
        seed_base = int(m.get("seed_base", 1000 * i))

        def jobs_of(key: str, offset: int) -> tuple[Job, ...]:
            out = []
            for j, entry in enumerate(m.get(key, [])):
                options = entry[3] if isinstance(entry, list) and len(entry) == 4 else {}
                if (not isinstance(entry, list) or len(entry) not in (2, 3, 4) or not isinstance(options, dict)
                        or set(options) - {"temperature"}):
                    raise ServebookError(f"model {model!r}: a job is [shape, requests], [shape, requests, seed] or "
                                         f"[shape, requests, seed, {{temperature = T}}], got {entry!r}")
                shape_name, requests = entry[0], entry[1]
                if shape_name not in shapes:
                    raise ServebookError(f"model {model!r}: unknown shape {shape_name!r}; use one of {', '.join(shapes)}")
                if int(requests) < 1:
                    raise ServebookError(f"model {model!r}: job {shape_name!r} needs at least 1 request")
                seed = int(entry[2]) if len(entry) >= 3 else seed_base + offset + j
                temperature = float(options.get("temperature", 0.0))
                if temperature < 0:
                    raise ServebookError(f"model {model!r}: job {shape_name!r} temperature must be >= 0")
                out.append(Job(model, shapes[shape_name], int(requests), seed=seed, temperature=temperature))
            return tuple(out)

        config_path = str(path.parent / m["config"]) if "config" in m else None
        environment = m.get("environment", {})
        if not isinstance(environment, dict) or not all(isinstance(v, str) for v in environment.values()):
            raise ServebookError(f"model {model!r}: environment must be a table of strings, got {environment!r}")
        models[model] = ModelPlan(model, m.get("kind", ""), dict(base, **m.get("engine", {})), jobs_of("jobs", 0),
                                  config_path, warm_up=jobs_of("warm_up", 500), config_model=m.get("config_model"),
                                  environment=dict(environment))
    targets = {k: list(v) for k, v in raw.get("targets", {}).items()}
    for target, names in targets.items():
        for name in names:
            if name not in models:
                raise ServebookError(f"target {target!r} names model {name!r}, which has no [models.{name}] entry")
    return E2EPlan(base, shapes, targets, models)


def lognormal_lengths(n: int, mean: float, cv: float, seed: int, *, high: int | None = None) -> list[int]:
    """``n`` token lengths, lognormal with this mean and cv (std/mean), rounded, in ``[1, high]``.

    cv 0 gives ``n`` copies of the rounded mean. Deterministic for a given seed.
    """
    if n < 1 or mean < 1 or cv < 0:
        raise ServebookError(f"lengths need n >= 1, mean >= 1 token and cv >= 0 (got {n}, {mean}, {cv})")
    rng = random.Random(seed)
    sigma = math.sqrt(math.log1p(cv * cv))
    mu = math.log(mean) - sigma * sigma / 2
    out = [max(1, round(rng.lognormvariate(mu, sigma) if cv else mean)) for _ in range(n)]
    return [min(x, high) for x in out] if high else out


def job_lengths(job: Job, max_model_len: int) -> tuple[list[int], list[int]]:
    """(prompt lengths, output lengths) of ``job``; each prompt shortened so prompt + output fit ``max_model_len``."""
    s = job.shape
    outputs = lognormal_lengths(job.requests, s.output_mean, s.output_cv, job.seed * 2 + 1, high=max_model_len // 2)
    inputs = lognormal_lengths(job.requests, s.input_mean, s.input_cv, job.seed * 2, high=max_model_len - 1)
    return [min(i, max_model_len - o) for i, o in zip(inputs, outputs)], outputs


def token_prompts(lengths: list[int], vocab_size: int, seed: int) -> list[list[int]]:
    """Random token-id prompts of these lengths, ids in ``[FIRST_TOKEN_ID, vocab_size - FIRST_TOKEN_ID)``.

    Independent uniform ids: two prompts share a first 16-token block with probability about
    ``vocab^-16``, so the prefix cache finds (almost) nothing to reuse.
    """
    if vocab_size <= 2 * FIRST_TOKEN_ID + 1:
        raise ServebookError(f"vocabulary of {vocab_size} tokens is too small for random prompts")
    rng = random.Random(seed)
    ids = range(FIRST_TOKEN_ID, vocab_size - FIRST_TOKEN_ID)
    return [rng.choices(ids, k=n) for n in lengths]


def predict(config: dict | str, inputs: list[int], outputs: list[int], engine_args: dict, *,
            gpu: str = "h200") -> dict:
    """What ``servebook fleet`` predicts for this job on one ``gpu`` with these engine flags.

    The job's own drawn lengths enter as 64 quantiles each for the steady state and whole for the
    replay of the ramp and drain (:meth:`~servebook.perf.fleet.LengthDistribution.of_job`; fleet treats
    prompt and output lengths as independent). Returns ``seconds`` (wall time of the whole job), ``output_tokens_per_s``,
    ``batch`` (decode batch), ``batch_kv_bound``, ``step_s`` and ``bound``.
    """
    from servebook.hf_config import load_model_spec
    from servebook.perf.fleet import Deployment, LengthDistribution, Workload, plan
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients

    spec = load_model_spec(config)
    g = gpu_numbers(gpu)
    coeffs, where = calibrated_coefficients(g.name)
    work = Workload(len(inputs), LengthDistribution.of_job(inputs), LengthDistribution.of_job(outputs))
    d = Deployment.of(spec, gpu=g, gpus=1, name=spec.name, tp=1,
                   max_num_seqs=int(engine_args["max_num_seqs"]),
                   max_num_batched_tokens=int(engine_args["max_num_batched_tokens"]),
                   gpu_memory_utilization=float(engine_args["gpu_memory_utilization"]),
                   kv_cache_dtype=str(engine_args.get("kv_cache_dtype", "auto")))
    p = plan(work, d, coeffs)
    return {"gpu": g.name, "calibration": where, "seconds": p.hours * 3600,
            "output_tokens_per_s": p.output_tokens_per_s, "batch": p.batch, "batch_kv_bound": p.batch_kv_bound,
            "step_s": p.step_s, "bound": p.bound}


def plan_rows(plan: E2EPlan, models: list[str], *, gpu: str = "h200") -> list[dict]:
    """One row per job of ``models``: model, job, requests, mean lengths, fleet's predicted seconds and batch."""
    rows = []
    for model in models:
        mp = plan.model(model)
        config = mp.config()
        for job in mp.jobs:
            inputs, outputs = job_lengths(job, int(mp.engine_args["max_model_len"]))
            pred = predict(config, inputs, outputs, mp.engine_args, gpu=gpu)
            rows.append({"model": model, "kind": mp.kind, "job": job.name, "requests": job.requests,
                         "mean_input": sum(inputs) / len(inputs), "mean_output": sum(outputs) / len(outputs),
                         "predicted_s": pred["seconds"], "batch": pred["batch"],
                         "requests_per_batch": job.requests / max(pred["batch"], 1)})
    return rows


def plan_text(plan: E2EPlan, targets: dict[str, list[str]], *, gpu: str = "h200") -> str:
    """The runner's plan: per target, per model an engine start and its jobs with predicted seconds."""
    lines = []
    for target, models in targets.items():
        rows = plan_rows(plan, models, gpu=gpu)
        total = len(models) * ENGINE_START_S + sum(r["predicted_s"] for r in rows)
        lines.append(f"{target}: {', '.join(models)}  ~{total:.0f} s predicted "
                     f"({len(models)} engine starts at ~{ENGINE_START_S:.0f} s + jobs as fleet predicts them)")
        for r in rows:
            lines.append(f"  {r['model']:18s} {r['job']:18s} in {r['mean_input']:6.0f} out {r['mean_output']:5.0f}  "
                         f"fleet {r['predicted_s']:5.1f} s, batch {r['batch']:3d}, "
                         f"{r['requests_per_batch']:4.1f} batches of requests")
    return "\n".join(lines)
