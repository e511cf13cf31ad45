#!/usr/bin/env python3
"""Record real-engine data on a GPU node: startup logs and step timings, with provenance.

Usage (on the GPU node, inside the vLLM environment):
    python labs/tools/gpu_record.py startup --cases mistral-7b-v0.1:eager,gemma-3-27b:eager --out OUT.json
    python labs/tools/gpu_record.py timing --model llama-3.1-8b --token-cap 262144 --out OUT.json

Every engine runs in its own child process (so its GPU memory is freed and its startup
log is captured whole); the parent writes one JSON file, re-written after each case so a
time-out still returns what finished. Weights are random (``load_format="dummy"``): no
checkpoint is downloaded; memory, batching and timing behave as with real weights.

Schemas: ``servebook.startup_logs/1`` and ``servebook.step_timing/1`` (see labs/results/README.md).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from servebook.lab.harness import gemma4_compat  # noqa: E402
from servebook.provenance import config_sha256, device_info, utc_now_iso, vllm_version  # noqa: E402
from servebook.shipped import MODELS_DIR as SHIPPED_MODELS_DIR  # noqa: E402
from servebook.tiny_model import language_model_config, write_model_dir  # noqa: E402

MODELS_DIR = Path(os.environ.get("SERVEBOOK_RECORD_MODELS_DIR", SHIPPED_MODELS_DIR))
MARK = "SERVEBOOK_RESULT "


def engine_config(model_id: str) -> dict:
    """The reference config as the engine loads it (text tower for multimodal checkpoints)."""
    return language_model_config(json.loads((MODELS_DIR / f"{model_id}.json").read_text()))


# ----------------------------------------------------------------------------- child side
def _prompt(rng: random.Random, n: int, vocab: int) -> dict:
    return {"prompt_token_ids": [rng.randrange(100, vocab - 100) for _ in range(n)]}


def _timed_generate(llm, prompts, max_tokens: int) -> float:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
    return elapsed


def _timing_workload(llm, spec: dict, vocab: int) -> dict:
    """Decode step time over (batch, context) and prefill time over prompt length."""
    rng = random.Random(spec.get("seed", 0))
    steps, repeats = spec["decode_steps"], spec["repeats"]
    _timed_generate(llm, [_prompt(rng, 64, vocab) for _ in range(8)], 16)  # warm-up
    decode = []
    for context in spec["contexts"]:
        fitting = [b for b in spec["batches"] if b * context <= spec["token_cap"]]
        if not fitting:
            continue
        prompts = [_prompt(rng, context, vocab) for _ in range(max(fitting))]
        _timed_generate(llm, prompts, 1)  # prefill once; later runs hit the prefix cache
        for batch in sorted(fitting, reverse=True):
            sub = prompts[:batch]
            samples = []
            for _ in range(repeats):
                t_one = _timed_generate(llm, sub, 1)
                t_many = _timed_generate(llm, sub, 1 + steps)
                samples.append((t_many - t_one) / steps)
            decode.append({"batch": batch, "prompt_tokens": context, "decode_steps": steps,
                           "mean_context_tokens": context + (steps + 1) / 2,
                           "step_s": statistics.median(samples), "samples_s": samples})
            print(f"decode B={batch} C={context}: {statistics.median(samples)*1e3:.2f} ms", flush=True)
    prefill = []
    for tokens in spec["prefill_tokens"]:
        samples = [_timed_generate(llm, [_prompt(rng, tokens, vocab)], 1) for _ in range(spec["prefill_repeats"])]
        prefill.append({"tokens": tokens, "time_s": statistics.median(samples), "samples_s": samples})
        print(f"prefill T={tokens}: {statistics.median(samples)*1e3:.1f} ms", flush=True)
    return {"decode": decode, "prefill": prefill}


def child(case_path: str) -> None:
    case = json.loads(Path(case_path).read_text())
    from vllm import LLM

    model_dir = write_model_dir(tempfile.mkdtemp(prefix="model-"), case["config"], tokenizer=False)
    kwargs = dict(case["engine_args"])
    llm = LLM(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, seed=0, **kwargs)
    vocab = int(case["config"].get("vocab_size", 32000))
    result: dict = {"ok": True}
    _timed_generate(llm, [_prompt(random.Random(1), 32, vocab)], 4)
    if case.get("timing"):
        result.update(_timing_workload(llm, case["timing"], vocab))
    print(MARK + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- parent side
def run_child(script: str, case: dict, timeout_s: float, mark: str, *, env: dict | None = None,
              merge_stderr: bool = True) -> dict:
    """Run ``python SCRIPT _child CASE.json`` (``case`` written to a temporary file) in a new session.

    Returns ``returncode`` (``"timeout"`` past ``timeout_s``), ``wall_s``, ``log`` (stdout with
    stderr interleaved, or with ``merge_stderr=False`` stdout then stderr) and ``result``: the JSON
    after the last line starting with ``mark`` (None: no such line). ``env`` is set for the child on
    top of this process's environment, ``PYTHONUNBUFFERED=1`` last. Used by :func:`run_case` and
    ``kv_groups_probe.py``.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(case, fh)
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, script, "_child", fh.name], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"})
    try:
        out, err = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    finally:
        # The engine core and workers are grandchildren: kill the whole process group so
        # the next case starts on a GPU with its memory free.
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
    if rc == "timeout":
        out, err = proc.communicate()
    log = out + (err or "")
    result = None
    for line in log.splitlines():
        if line.startswith(mark):
            result = json.loads(line[len(mark):])
    return {"returncode": rc, "wall_s": round(time.time() - t0, 1), "log": log, "result": result}


def run_case(case: dict, timeout_s: float) -> dict:
    """Run one engine in a child process; return the case with its log and result."""
    out = dict(case, **run_child(__file__, case, timeout_s, MARK, env=case.get("environment", {})))
    rc, log = out["returncode"], out["log"]
    print(f"[{case['name']}] rc={rc} in {out['wall_s']} s", flush=True)
    if rc != 0:
        print("\n".join(log.splitlines()[-15:]), flush=True)
    return out


#: GPTQ layers of a Llama-style block, as GPTQModel writes ``modules_in_block_to_quantize``.
GPTQ_BLOCK_MODULES = [["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj"], ["self_attn.o_proj"],
                      ["mlp.up_proj", "mlp.gate_proj"], ["mlp.down_proj"]]


def dummy_ready(cfg: dict) -> tuple[dict, str | None]:
    """The config as a dummy-weights engine must see it, and what was added (None: unchanged).

    - GPTQ: vLLM (``AutoGPTQConfig.maybe_update_config``) takes the layers to quantize from
      ``modules_in_block_to_quantize`` or else from the checkpoint's safetensors dtypes; with
      ``load_format="dummy"`` there are none and every layer would load 16-bit. Naming every
      projection of the block is what a real checkpoint's safetensors say.
    - Gemma 4 text configs: ``allow_global_per_layer_attribute_access`` for transformers 5.17 and
      vLLM 0.26.0 (the lent image's), added by :func:`servebook.lab.harness.gemma4_compat.engine_config`
      (its docstring says why).
    """
    notes = []
    quant = cfg.get("quantization_config") or {}
    if str(quant.get("quant_method", "")).lower() == "gptq" and not quant.get("modules_in_block_to_quantize"):
        cfg = dict(cfg, quantization_config=dict(quant, modules_in_block_to_quantize=GPTQ_BLOCK_MODULES))
        notes.append("added quantization_config.modules_in_block_to_quantize (every block projection) for dummy weights")
    cfg, gemma4_notes = gemma4_compat.engine_config(cfg)
    notes += gemma4_notes
    return cfg, "; ".join(notes) or None


def make_case(name: str, model_id: str, engine_args: dict, timing: dict | None = None,
              environment: dict | None = None) -> dict:
    """One engine to run; ``environment``: variables set for its process only (recorded with the case).

    The Gemma 4 ``hf_overrides`` (:func:`servebook.lab.harness.gemma4_compat.engine_args_with_overrides`)
    join ``engine_args`` and their note joins ``config_adjustment``.
    """
    cfg, adjusted = dummy_ready(engine_config(model_id))
    engine_args, notes = gemma4_compat.engine_args_with_overrides(engine_args, cfg)
    adjusted = "; ".join(([adjusted] if adjusted else []) + notes) or None
    case = {"name": name, "model_id": model_id, "config": cfg, "config_sha256": config_sha256(cfg),
            "engine_args": engine_args, "timing": timing}
    if adjusted:
        case["config_adjustment"] = adjusted
    if environment:
        case["environment"] = dict(environment)
    return case


STARTUP_ARGS = {
    "eager": dict(enforce_eager=True, max_model_len=32768, gpu_memory_utilization=0.90),
    "eager16k": dict(enforce_eager=True, max_model_len=16384, gpu_memory_utilization=0.90),
    # The same with a quarter of the offline token budget: the profiling run's activations scale with
    # max_num_batched_tokens, so the pair separates per-token buffers (MoE workspaces) from the rest.
    "eager16k-b4k": dict(enforce_eager=True, max_model_len=16384, gpu_memory_utilization=0.90,
                         max_num_batched_tokens=4096),
    "fp8kv": dict(enforce_eager=True, max_model_len=32768, gpu_memory_utilization=0.80,
                  kv_cache_dtype="fp8", max_num_batched_tokens=8192),
    "util50": dict(enforce_eager=True, max_model_len=8192, gpu_memory_utilization=0.50,
                   max_num_batched_tokens=4096),
    "graphs": dict(max_model_len=16384, gpu_memory_utilization=0.90),
    # LoRA reserves its stacked adapter tensors for max_loras slots of max_lora_rank on every
    # module adapters may touch, and the profiling run carries dummy adapters (issue 40).
    "lora": dict(enforce_eager=True, max_model_len=16384, gpu_memory_utilization=0.90,
                 enable_lora=True, max_loras=4, max_lora_rank=64, max_cpu_loras=4),
}


def write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "_child":
        return child(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["startup", "timing"])
    ap.add_argument("--cases", default="", help="MODEL:PROFILE,... (profiles: %s)" % ",".join(STARTUP_ARGS))
    ap.add_argument("--model", default="")
    ap.add_argument("--token-cap", type=int, default=262144)
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size of the timing engine")
    ap.add_argument("--contexts", default="512,2048,8192,16384")
    ap.add_argument("--batches", default="1,4,16,32,64,128,256")
    ap.add_argument("--prefill-tokens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--repeats", type=int, default=2,
                    help="decode samples per (batch, context); each sample is kept in samples_s")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment variable for the engine's process (repeatable), e.g. "
                         "VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random; recorded with the case")
    ap.add_argument("--suffix", default="", help="appended to the case name (e.g. -uniform)")
    ap.add_argument("--budget-s", type=float, default=480, help="stop starting new cases after this")
    ap.add_argument("--timeout-s", type=float, default=300)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t_start = time.time()
    doc = {"date": utc_now_iso(), "gpu": device_info(), "vllm_version": vllm_version(),
           "method": "", "cases": []}
    if args.mode == "startup":
        doc["schema"] = "servebook.startup_logs/1"
        doc["method"] = "one LLM(...) per case in a fresh process, load_format=dummy, one short request"
        cases = [make_case(f"{m}--{p}", m, STARTUP_ARGS[p]) for m, p in (c.split(":") for c in args.cases.split(","))]
    else:
        doc["schema"] = "servebook.step_timing/1"
        doc["method"] = ("decode step_s = (T(1+N) - T(1)) / N for B distinct prompts already in the prefix cache "
                         "(median of repeats); prefill time_s = wall time of llm.generate for one new prompt "
                         "with max_tokens=1 (median of repeats); CUDA graphs on; greedy; ignore_eos")
        timing = {"contexts": [int(x) for x in args.contexts.split(",")],
                  "batches": [int(x) for x in args.batches.split(",")],
                  "token_cap": args.token_cap, "decode_steps": 32, "repeats": args.repeats,
                  "prefill_tokens": [int(x) for x in args.prefill_tokens.split(",")], "prefill_repeats": 3}
        engine_args = dict(max_model_len=max(timing["contexts"] + timing["prefill_tokens"]) + 64,
                           gpu_memory_utilization=0.90, max_num_seqs=max(timing["batches"]),
                           max_num_batched_tokens=16384, tensor_parallel_size=args.tp)
        suffix = ("" if args.tp == 1 else f"-tp{args.tp}") + args.suffix
        environment = dict(kv.split("=", 1) for kv in args.env)
        cases = [make_case(f"{args.model}--timing{suffix}", args.model, engine_args, timing, environment)]
    out = Path(args.out)
    for case in cases:
        if time.time() - t_start > args.budget_s:
            print(f"[{case['name']}] skipped: budget of {args.budget_s} s spent", flush=True)
            continue
        doc["cases"].append(run_case(case, args.timeout_s))
        write(out, doc)
    write(out, doc)


if __name__ == "__main__":
    main()
