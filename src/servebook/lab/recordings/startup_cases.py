"""Recorded GPU start-ups (``labs/tools/gpu_record.py startup``) against servebook's prediction.

One case of a ``servebook.startup_logs/1`` file holds the config the engine loaded, its engine
arguments and its whole log. :func:`compare_startup_case` predicts the same start-up from the
config and arguments alone (weights from the shapes and the ``quantization_config``, LoRA slots
from ``enable_lora``/``max_loras``/``max_lora_rank``, the fitted activation/non-torch/graph
coefficients) and sets it beside what the engine logged: ``Model loading took``, ``Available KV
cache memory`` and ``GPU KV cache size``. Errors are ``(predicted - logged) / logged`` in percent.
"""
from __future__ import annotations

from dataclasses import dataclass

from servebook.errors import ServebookError
from servebook.hf_config import load_model_spec
from servebook.kv_cache import capacity
from servebook.lora import LoraSettings, lora_activation_bytes, lora_weights_bytes
from servebook.memory import GIB, memory_budget, vllm_batch_defaults
from servebook.startup_log import parse_startup_log


def dummy_load_artifact(case: dict) -> str | None:
    """Why a dummy-weights start-up does not show the checkpoint's storage, or None when it does.

    vLLM 0.26.0/0.27.1 (``AutoGPTQConfig.maybe_update_config``) take the GPTQ layers to quantize from
    ``modules_in_block_to_quantize`` or, when the config has none, from the dtypes of the checkpoint's
    safetensors; ``load_format="dummy"`` has no safetensors, so every layer loads 16-bit.
    """
    quant = (case.get("config") or {}).get("quantization_config") or {}
    if (str(quant.get("quant_method", "")).lower() == "gptq" and not quant.get("modules_in_block_to_quantize")
            and case.get("engine_args", {}).get("load_format", "dummy") == "dummy"):
        return ("GPTQ without modules_in_block_to_quantize under dummy weights: vLLM found no safetensors "
                "dtypes and loaded every layer 16-bit")
    return None


@dataclass(frozen=True)
class StartupComparison:
    """One recorded start-up beside its prediction (bytes and tokens; errors in percent)."""

    name: str
    predicted_loading_bytes: int
    logged_loading_bytes: int | None
    predicted_available_kv_bytes: int
    logged_available_kv_bytes: int | None
    predicted_kv_tokens: int
    logged_kv_tokens: int | None

    @staticmethod
    def _pct(pred, logged) -> float | None:
        return None if not logged else 100.0 * (pred - logged) / logged

    @property
    def loading_error_pct(self) -> float | None:
        """Weights (+ LoRA slots) against ``Model loading took``, percent."""
        return self._pct(self.predicted_loading_bytes, self.logged_loading_bytes)

    @property
    def available_kv_error_pct(self) -> float | None:
        """Against ``Available KV cache memory``, percent."""
        return self._pct(self.predicted_available_kv_bytes, self.logged_available_kv_bytes)

    @property
    def kv_tokens_error_pct(self) -> float | None:
        """Against ``GPU KV cache size``, percent."""
        return self._pct(self.predicted_kv_tokens, self.logged_kv_tokens)

    def row(self) -> str:
        """One line of a table: GiB and tokens, predicted / logged (error)."""
        def f(p, l, e, scale=GIB, fmt="{:.2f}"):
            logged = "-" if l is None else fmt.format(l / scale)
            err = "" if e is None else f" ({e:+.2f}%)"
            return f"{fmt.format(p / scale)}/{logged}{err}"
        return (f"{self.name:40s} loading {f(self.predicted_loading_bytes, self.logged_loading_bytes, self.loading_error_pct)}"
                f"  KV GiB {f(self.predicted_available_kv_bytes, self.logged_available_kv_bytes, self.available_kv_error_pct)}"
                f"  tokens {f(self.predicted_kv_tokens, self.logged_kv_tokens, self.kv_tokens_error_pct, 1, '{:,.0f}')}")


def compare_startup_case(case: dict, gpu_total_memory_bytes: int | None = None) -> StartupComparison:
    """Predict one recorded start-up case (``gpu_record.py`` schema) and pair it with its log.

    ``gpu_total_memory_bytes``: the device total when the log stops before the engine prints it
    (a case killed during its warm-up, after the KV cache was sized); the file's ``gpu`` block has it.

    Raises:
        ServebookError: the case lacks a config, engine arguments or a log with the GPU total.
    """
    try:
        config, kw, text = case["config"], dict(case["engine_args"]), case["log"]
    except (KeyError, TypeError):
        raise ServebookError("a start-up case needs 'config', 'engine_args' and 'log' "
                             "(labs/tools/gpu_record.py startup writes them)") from None
    log = parse_startup_log(text)
    if log.total_memory_gib:
        total = round(log.total_memory_gib * GIB)
    elif gpu_total_memory_bytes:
        total = int(gpu_total_memory_bytes)
    else:
        raise ServebookError(f"{case.get('name')}: the log states no GPU total; pass gpu_total_memory_bytes "
                             "(the recording's gpu.total_memory_bytes)")
    spec = load_model_spec(config, name=case.get("model_id"))
    max_model_len = kw.get("max_model_len") or log.max_model_len or spec.max_position_embeddings
    default_tokens, default_seqs = vllm_batch_defaults(total, "NVIDIA H200", usage_context="LLM_CLASS",
                                                       max_model_len=max_model_len)
    tokens = kw.get("max_num_batched_tokens") or log.max_num_batched_tokens or default_tokens
    seqs = kw.get("max_num_seqs") or min(default_seqs, tokens)
    tp = kw.get("tensor_parallel_size", 1)
    lora = None
    if kw.get("enable_lora"):
        lora = LoraSettings(kw.get("max_loras", 1), kw.get("max_lora_rank", 16), kw.get("max_cpu_loras"))
    budget = memory_budget(
        spec, gpu_memory_bytes=total, max_num_batched_tokens=tokens, max_num_seqs=seqs,
        gpu_memory_utilization=kw.get("gpu_memory_utilization", 0.92), tp=tp,
        enforce_eager=bool(kw.get("enforce_eager", False)),
        lora_weights_for=None if lora is None else (lambda t: lora_weights_bytes(spec, lora, t)),
        lora_activation_bytes=0 if lora is None else lora_activation_bytes(spec, lora, tokens),
    )
    cap = capacity(spec, budget.available_kv_bytes, max_model_len=max_model_len, max_num_batched_tokens=tokens,
                   kv_cache_dtype=kw.get("kv_cache_dtype", "auto"), tp=tp, device="cuda")
    return StartupComparison(
        name=str(case.get("name")),
        predicted_loading_bytes=budget.model_loading_bytes,
        logged_loading_bytes=log.model_loading_bytes,
        predicted_available_kv_bytes=budget.available_kv_bytes,
        logged_available_kv_bytes=log.available_kv_cache_bytes,
        predicted_kv_tokens=cap.kv_cache_tokens,
        logged_kv_tokens=log.kv_cache_tokens,
    )
