#!/usr/bin/env python3
"""Print the KV cache groups vLLM builds for a model: what its start-up log does not say.

Usage (on the GPU node, inside the vLLM environment):
    python labs/tools/kv_groups_probe.py --cases gemma-4-26b-a4b:eager16k,gemma-4-31b:eager16k --out OUT.json

The start-up log gives the pool (``Available KV cache memory``) and the admission figure
(``GPU KV cache size``, ``Maximum concurrency``) but not how vLLM grouped the layers, the page
and block size of each group, or the heads and head sizes behind each page. This probe starts
each case (gpu_record.py's configs and engine profiles, dummy weights) with the engine core in
the probe's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and records the scheduler's
``KVCacheConfig``: every group's layer names and spec. One engine per child process.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_record  # noqa: E402
from servebook.provenance import device_info, utc_now_iso, vllm_version  # noqa: E402
from servebook.tiny_model import write_model_dir  # noqa: E402

MARK = "SERVEBOOK_KV_GROUPS "
SPEC_FIELDS = ("block_size", "num_kv_heads", "head_size", "head_size_v", "sliding_window", "page_size_padded")


def _spec(spec) -> dict:
    out = {"type": type(spec).__name__, "page_size_bytes": int(spec.page_size_bytes),
           "dtype": str(getattr(spec, "dtype", ""))}
    for name in SPEC_FIELDS:
        value = getattr(spec, name, None)
        out[name] = value if isinstance(value, (int, type(None))) else str(value)
    return out


def child(case_path: str) -> None:
    case = json.loads(Path(case_path).read_text())
    from vllm import LLM

    model_dir = write_model_dir(tempfile.mkdtemp(prefix="model-"), case["config"], tokenizer=False)
    llm = LLM(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, seed=0, **case["engine_args"])
    core = llm.llm_engine.engine_core.engine_core
    config = core.scheduler.kv_cache_config
    hf = llm.llm_engine.vllm_config.model_config.hf_text_config
    seen = {}
    for name in ("num_key_value_heads", "num_global_key_value_heads", "head_dim", "global_head_dim",
                 "sliding_window", "attention_k_eq_v", "num_hidden_layers"):
        try:
            seen[name] = getattr(hf, name)
        except Exception as exc:  # a heterogeneous config may refuse a global read
            seen[name] = f"unreadable: {type(exc).__name__}"
    result = {"num_blocks": int(config.num_blocks),
              "groups": [{"layers": list(g.layer_names), "spec": _spec(g.kv_cache_spec)}
                         for g in config.kv_cache_groups],
              "kv_cache_tensors": [{"size": int(t.size), "shared_by": len(t.shared_by)}
                                   for t in config.kv_cache_tensors],
              "hf_text_config": {k: v if isinstance(v, (int, float, bool, type(None))) else str(v)
                                 for k, v in seen.items()}}
    print(MARK + json.dumps(result), flush=True)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "_child":
        return child(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True, help="MODEL:PROFILE,... (gpu_record.py's profiles)")
    ap.add_argument("--timeout-s", type=float, default=240)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    doc = {"schema": "servebook.kv_groups/1", "date": utc_now_iso(), "gpu": device_info(),
           "vllm_version": vllm_version(), "method": __doc__.strip().splitlines()[0], "cases": []}
    for model, profile in (c.split(":") for c in args.cases.split(",")):
        case = gpu_record.make_case(f"{model}--{profile}", model, gpu_record.STARTUP_ARGS[profile])
        # VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine core runs in the child, where it can be read
        run = gpu_record.run_child(__file__, case, args.timeout_s, MARK, merge_stderr=False,
                                   env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
        doc["cases"].append(dict(case, **run))
        print(f"[{case['name']}] rc={run['returncode']} in {run['wall_s']:.0f} s", flush=True)
        if run["result"]:
            for g in run["result"]["groups"]:
                print(f"  {len(g['layers']):3d} layers {g['spec']}", flush=True)
            print(f"  num_blocks {run['result']['num_blocks']}  hf {run['result']['hf_text_config']}", flush=True)
        else:
            print("\n".join(run["log"].splitlines()[-12:]), flush=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
