"""Run inside .venv-vllm: submit more requests than the admission bound and count how many run at once.

Argument: a JSON file ``{"model_dir", "engine": {LLM kwargs}, "requests", "prompt_tokens", "output_tokens"}``.
The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that ``Scheduler.schedule`` can be
wrapped: after every step it records ``len(scheduler.running)`` (requests holding KV blocks), the step's
preemptions and the pool's free blocks. Per-request ``RequestOutput.metrics`` (``disable_log_stats=False``)
give a second count: requests decoding at once, from ``first_token_ts`` / ``last_token_ts``.

Prints one line ``SERVEBOOK_RESULT {json}`` (vLLM logs to stdout too).
"""
import json
import random
import sys


def peak_overlap(intervals):
    """Most half-open ``[start, end)`` intervals covering one instant (an end at t comes before a start at t)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def main(path: str) -> None:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler

    job = json.loads(open(path).read())
    steps, seen = [], {}
    original = Scheduler.schedule

    def recording_schedule(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        seen["scheduler"] = self
        steps.append({"running": len(self.running), "preempted": len(out.preempted_req_ids or ()),
                      "free_blocks": int(self.kv_cache_manager.block_pool.get_num_free_blocks())})
        return out

    Scheduler.schedule = recording_schedule
    try:
        llm = LLM(model=job["model_dir"], load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
                  disable_log_stats=False, seed=0, **job["engine"])
        rng = random.Random(0)
        prompts = [{"prompt_token_ids": [rng.randrange(10, 1000) for _ in range(job["prompt_tokens"])]}
                   for _ in range(job["requests"])]
        params = SamplingParams(temperature=0.0, max_tokens=job["output_tokens"], ignore_eos=True, detokenize=False)
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        Scheduler.schedule = original
    sched = seen["scheduler"]
    decoding = [(o.metrics.first_token_ts, o.metrics.last_token_ts) for o in outs]
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    print("SERVEBOOK_RESULT " + json.dumps({
        "vllm": vllm.__version__,
        "num_gpu_blocks": sched.cache_config.num_gpu_blocks,
        "block_size": sched.block_size,
        "async_scheduling": bool(sched.scheduler_config.async_scheduling),
        "group_block_sizes": [g.kv_cache_spec.block_size for g in sched.kv_cache_config.kv_cache_groups],
        "peak_running": max(s["running"] for s in steps),
        "peak_decoding_from_metrics": peak_overlap(decoding),
        "preemptions": sum(s["preempted"] for s in steps),
        "preemptions_metric": metrics.get("vllm:num_preemptions"),
        "min_free_blocks": min(s["free_blocks"] for s in steps),
        "steps": len(steps),
        "output_lengths": sorted({len(o.outputs[0].token_ids) for o in outs}),
    }), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()
