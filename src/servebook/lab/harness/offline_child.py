"""Child side of :mod:`servebook.lab.harness.offline`: run jobs in the engine's Python, print results.

Run as ``python -m servebook.lab.harness.offline_child JOBS.json``. For each job it prints
``SERVEBOOK_JOB_BEGIN <i>``, whatever the job (and vLLM) prints, then
``SERVEBOOK_JOB_END <i> <json>`` with ``{"ok", "result", "error", "wall_s"}``. A failing job
does not stop the next one. Kinds:

* ``engine_start`` — ``LLM(**engine_args)``: the start-up log is the job's output.
* ``generate`` — ``LLM(**engine_args).generate`` on token-id prompts of given lengths
  (``ignore_eos``: exact output lengths); returns wall time and token counts.
* ``hf_static`` — the static-batching baseline: HF transformers ``generate`` on
  left-padded batches of ``batch_size`` requests in arrival order, each batch running
  until its longest output is done; the model is built from ``config.json`` with random
  weights (no download), in ``dtype`` on ``device``.
* ``provenance`` — device, driver, torch and vLLM versions.
"""
from __future__ import annotations

import gc
import json
import random
import sys
import time
import traceback

BEGIN, END = "SERVEBOOK_JOB_BEGIN", "SERVEBOOK_JOB_END"


def _prompts(lens: list[int], vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, max(11, vocab - 10)) for _ in range(n)] for n in lens]


def _shutdown(llm) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001
        pass


def engine_start(job: dict) -> dict:
    from vllm import LLM

    llm = LLM(**job["engine_args"])
    _shutdown(llm)
    del llm
    gc.collect()
    return {"started": True}


def generate(job: dict) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(**job["engine_args"])
    prompts = [{"prompt_token_ids": p} for p in _prompts(job["input_lens"], job["vocab_size"], job.get("seed", 0))]
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, detokenize=False)
              for n in job["output_lens"]]
    llm.generate(prompts[:1], params[:1], use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    _shutdown(llm)
    return {"wall_s": wall, "output_tokens": produced, "output_throughput": produced / wall}


def hf_static(job: dict) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    device = job.get("device", "cpu")
    dtype = getattr(torch, job.get("dtype", "bfloat16"))
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(job["model_dir"])
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    model.eval()
    pad = 0
    inputs, outputs, b = job["input_lens"], job["output_lens"], job["batch_size"]
    prompts = _prompts(inputs, config.vocab_size, job.get("seed", 0))

    def run_batch(rows: list[list[int]], new_tokens: int) -> int:
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
        if device == "cuda":
            torch.cuda.synchronize()
        return out.shape[1] - width

    run_batch(prompts[:2], 2)  # warm-up
    rows, t0 = [], time.perf_counter()
    for start in range(0, len(prompts), b):
        idx = list(range(start, min(start + b, len(prompts))))
        steps = max(outputs[i] for i in idx)
        made = run_batch([prompts[i] for i in idx], steps)
        end = time.perf_counter() - t0
        for i in idx:
            rows.append({"input_len": inputs[i], "output_len": outputs[i], "latency_s": end,
                         "batch": start // b, "batch_steps": made})
    wall = time.perf_counter() - t0
    useful = sum(outputs)
    computed = sum(r["batch_steps"] for r in rows)
    return {"wall_s": wall, "output_tokens": useful, "output_throughput": useful / wall,
            "computed_tokens": computed, "requests": rows, "batch_size": b,
            "transformers_version": __import__("transformers").__version__}


def provenance(job: dict) -> dict:
    from servebook.provenance import device_info, vllm_version

    return {"gpu": device_info(), "vllm_version": vllm_version()}


KINDS = {"engine_start": engine_start, "generate": generate, "hf_static": hf_static, "provenance": provenance}


def main(path: str) -> None:
    jobs = json.loads(open(path).read())
    for i, job in enumerate(jobs):
        print(f"{BEGIN} {i}", flush=True)
        t0 = time.perf_counter()
        try:
            result = {"ok": True, "result": KINDS[job["kind"]](job), "error": ""}
        except Exception as exc:  # noqa: BLE001  (report and go on to the next job)
            traceback.print_exc()
            sys.stderr.flush()
            result = {"ok": False, "result": None, "error": f"{type(exc).__name__}: {exc}"}
        result["wall_s"] = time.perf_counter() - t0
        sys.stderr.flush()
        print(f"{END} {i} {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
