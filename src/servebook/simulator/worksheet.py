"""The sizing worksheet: one deployment carried from memory to cost per million output tokens.

Six stages, each computed by the library's own model for that stage, in the order a reader sizes:

1. **memory** (per GPU): weights, activation peak, non-torch, CUDA graphs, and the KV cache left
   (:mod:`servebook.memory`, through the deployment's :class:`~servebook.plan.Plan`), in GiB and tokens;
2. **batch**: full-length requests the KV cache runs at once, vLLM's ``max_num_seqs``, and the
   requests running at the offered rate (the scheduler simulator);
3. **step time**: a decode step of that many requests at their mean context, and the same step
   carrying a full prefill chunk (the calibrated step model), seconds;
4. **latency**: p50/p90 TTFT and TPOT under ``vllm bench serve``'s definitions, with the held-out
   band (:func:`servebook.simulator.online.predict_latency`);
5. **throughput**: output tokens per second per GPU;
6. **cost**: per hour and per million output tokens at an assumed GPU price.

:func:`worked_example` reads the chapter's example from ``data/worked_example.toml``; its layout is
the one ``servebook tune`` picks for that workload (``tests/test_worksheet.py`` re-runs the search).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache

from servebook.errors import ServebookError

GIB = 2**30


@dataclass(frozen=True)
class Worksheet:
    """The six stages of one deployment. Units: bytes as GiB, seconds, tokens, requests, USD."""

    model: str
    gpu: str
    tp: int
    replicas: int
    kv_cache_dtype: str
    rate_per_s: float
    prompt_tokens: int
    output_tokens: int
    # 1. memory, per GPU
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    cudagraph_gib: float
    kv_gib: float
    kv_tokens: int
    # 2. batch
    full_length_running: int
    max_num_seqs: int
    max_num_batched_tokens: int
    running_at_rate: float
    # 3. step time
    mean_context_tokens: float
    decode_step_s: float
    prefill_chunk_tokens: int
    mixed_step_s: float
    # 4. latency (p50, p90) and the held-out band (None: no measurement of the serving path's error)
    ttft_s: dict
    tpot_s: dict
    band: dict | None
    # 5. throughput
    output_tokens_per_s_per_gpu: float
    # 6. cost
    price_per_gpu_hour: float | None
    serve_command: str

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas

    @property
    def cost_per_hour(self) -> float | None:
        return None if self.price_per_gpu_hour is None else self.gpus * self.price_per_gpu_hour

    @property
    def cost_per_million_output_tokens(self) -> float | None:
        """USD per million output tokens at the offered rate (the fleet serves ``rate_per_s``)."""
        if self.price_per_gpu_hour is None:
            return None
        tokens_per_hour = self.output_tokens_per_s_per_gpu * self.gpus * 3600.0
        return self.cost_per_hour / tokens_per_hour * 1e6

    def rows(self) -> list[tuple[str, str, str]]:
        """``(stage, quantity, value)`` rows, what the book's worksheet table shows."""
        cost = ("no price given" if self.price_per_gpu_hour is None else
                f"USD {self.cost_per_hour:,.2f} per hour; USD {self.cost_per_million_output_tokens:,.2f} per million "
                f"output tokens (at an assumed USD {self.price_per_gpu_hour:,.2f} per GPU-hour)")
        def band(metric):
            b = (self.band or {}).get(f"{metric}_p90")
            return "" if not b else f" (p90 off by {b['p10']:+.0%}..{b['p90']:+.0%} on held-out runs)"
        return [
            ("1. memory", "per GPU: weights, activation, non-torch, graphs",
             f"{self.weights_gib:.1f} + {self.activation_gib:.2f} + {self.non_torch_gib:.2f} + {self.cudagraph_gib:.2f} GiB"),
            ("1. memory", "KV cache left per GPU", f"{self.kv_gib:.1f} GiB = {self.kv_tokens:,} tokens"),
            ("2. batch", "full-length requests running at once", f"{self.full_length_running:,}"),
            ("2. batch", f"requests running at {self.rate_per_s:g} requests/s", f"{self.running_at_rate:.0f} (mean)"),
            ("3. step time", f"decode step of those requests at {self.mean_context_tokens:,.0f} tokens of context",
             f"{self.decode_step_s * 1e3:.1f} ms"),
            ("3. step time", f"the same step with a {self.prefill_chunk_tokens:,}-token prefill chunk (the rest of the "
                             f"{self.max_num_batched_tokens:,}-token budget)",
             f"{self.mixed_step_s * 1e3:.1f} ms"),
            ("4. latency", "p50 / p90 time to first token",
             f"{self.ttft_s[50] * 1e3:,.0f} / {self.ttft_s[90] * 1e3:,.0f} ms{band('ttft')}"),
            ("4. latency", "p50 / p90 time per output token",
             f"{self.tpot_s[50] * 1e3:.1f} / {self.tpot_s[90] * 1e3:.1f} ms{band('tpot')}"),
            ("5. throughput", "output tokens/s per GPU", f"{self.output_tokens_per_s_per_gpu:,.0f}"),
            ("6. cost", f"{self.gpus} GPU(s)", cost),
        ]


def worksheet(model, *, gpu: str, tp: int, replicas: int, rate_per_s: float, prompt_tokens: int,
              output_tokens: int, range_ratio: float = 0.0, kv_cache_dtype: str = "auto",
              price_per_gpu_hour: float | None = None) -> Worksheet:
    """The worksheet of ``replicas`` x TP ``tp`` of ``model`` (a reference id or config.json) on
    ``gpu`` serving ``rate_per_s`` requests/s of ``prompt_tokens`` in and ``output_tokens`` out
    (uniform within +-``range_ratio``), at vLLM's serve defaults otherwise and the context a search
    would size (:func:`servebook.simulator.tune.default_max_model_len`)."""
    from servebook.plan import make_plan
    from servebook.simulator.online import OnlineWorkload
    from servebook.simulator.tune import default_max_model_len

    workload = OnlineWorkload(rate_per_s, prompt_tokens, output_tokens, range_ratio=range_ratio)
    plan = make_plan(model, gpu=gpu, tp=tp, kv_cache_dtype=kv_cache_dtype,
                     max_model_len=default_max_model_len(workload), usage_context="serve")
    return worksheet_of(plan, replicas, workload, price_per_gpu_hour=price_per_gpu_hour)


def worksheet_of(plan, replicas: int, workload, *, changed_flags: tuple[str, ...] = (),
                 price_per_gpu_hour: float | None = None) -> Worksheet:
    """The worksheet of ``replicas`` copies of a :class:`~servebook.plan.Plan` under an
    :class:`~servebook.simulator.online.OnlineWorkload` (e.g. a ``servebook tune`` candidate's plan;
    ``changed_flags`` are the flags it sets beyond vLLM's defaults, for the ``vllm serve`` line)."""
    from servebook.simulator.online import latency_band, predict_latency, replica_engine
    from servebook.simulator.tune import Candidate

    if price_per_gpu_hour is not None and price_per_gpu_hour < 0:
        raise ServebookError(f"price per GPU-hour must be >= 0, got {price_per_gpu_hour}")
    prompt_tokens, output_tokens = workload.input_tokens, workload.output_tokens
    pred = predict_latency(plan, workload, replicas=replicas)
    _, step, _ = replica_engine(plan)
    running = max(1, round(pred.mean_running))
    context = prompt_tokens + output_tokens / 2
    decode = step.step_s([], [round(context)] * running)
    # the step's token budget holds the decodes first; a prompt's chunk takes what is left of it
    chunk = max(0, min(prompt_tokens, plan.max_num_batched_tokens - running))
    mixed = step.step_s([(chunk, 0, chunk == prompt_tokens)], [round(context)] * running)
    b = plan.budget
    return Worksheet(
        model=plan.spec.name, gpu=plan.gpu_name, tp=plan.tp, replicas=replicas, kv_cache_dtype=plan.kv_cache_dtype,
        rate_per_s=workload.rate_per_s, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
        weights_gib=b.weights_bytes / GIB, activation_gib=b.activation_bytes / GIB,
        non_torch_gib=b.non_torch_bytes / GIB, cudagraph_gib=b.cudagraph_bytes / GIB,
        kv_gib=b.available_kv_bytes / GIB, kv_tokens=plan.capacity.kv_cache_tokens,
        full_length_running=plan.running.max_running, max_num_seqs=plan.max_num_seqs,
        max_num_batched_tokens=plan.max_num_batched_tokens, running_at_rate=pred.mean_running,
        mean_context_tokens=context, decode_step_s=decode, prefill_chunk_tokens=chunk, mixed_step_s=mixed,
        ttft_s=dict(pred.ttft_s), tpot_s=dict(pred.tpot_s), band=latency_band(plan.gpu_name),
        output_tokens_per_s_per_gpu=pred.output_tokens_per_s / plan.tp,
        price_per_gpu_hour=price_per_gpu_hour,
        serve_command=Candidate(plan, replicas, pred, tuple(changed_flags)).serve_command())


def example_parameters() -> dict:
    """The chapter's worked example as ``data/worked_example.toml`` states it."""
    from servebook.shipped import WORKED_EXAMPLE

    return tomllib.loads(WORKED_EXAMPLE.read_text())


@lru_cache(maxsize=1)
def worked_example() -> Worksheet:
    """The chapter's worked example (computed once per process)."""
    p = example_parameters()
    return worksheet(p["model"], gpu=p["gpu"], tp=p["tp"], replicas=p["replicas"], rate_per_s=p["rate_per_s"],
                     prompt_tokens=p["prompt_tokens"], output_tokens=p["output_tokens"],
                     range_ratio=p["range_ratio"], kv_cache_dtype=p["kv_cache_dtype"],
                     price_per_gpu_hour=p["assumed_price_per_gpu_hour_usd"])
