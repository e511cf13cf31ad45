"""Build a :class:`~servebook.model_spec.ModelSpec` from a Hugging Face ``config.json``.

The loader reads only the config (never the weights). From the shapes it
derives, layer by layer:

* the KV-cache-relevant attention of each decoder layer (full, sliding window,
  multi-head latent attention, cross-layer KV sharing), and
* every weight tensor the checkpoint holds, from which parameter counts
  (total and active per token) and the bytes the engine loads follow.

Supported families (``architectures[0]``): Llama, Mistral, Mixtral, Qwen2,
Qwen2-MoE, Qwen3, Qwen3-MoE, Gemma 3, Gemma 4, gpt-oss, DeepSeek V2/V3.

Reference models ship with the package as their public ``config.json``
(``servebook/data/models/<id>.json``); ``load_model_spec("llama-3.1-8b")``
loads one by id.

Approximations (documented, deliberate):

* Multimodal checkpoints (Gemma 3/4 ``*ForConditionalGeneration``) are counted
  text-only: the vision/audio towers are not in ``text_config`` and are not
  sized here. Their published sizes include the towers (see tests).
* DeepSeek-V3's multi-token-prediction (MTP) module
  (``num_nextn_predict_layers``) is not part of the served model: vLLM skips
  those weights unless MTP speculative decoding is on. :func:`mtp_params`
  sizes it separately.
* Checkpoints stored in float32 are counted at 2 bytes per parameter, as vLLM's
  ``--dtype auto`` serves them in 16-bit (``_resolve_auto_dtype`` in
  ``vllm/config/model.py``, 0.27.1: "Downcast for float32 models").
* Quantized checkpoints (:mod:`servebook.quant_schemes`): AWQ, GPTQ, FP8 (per tensor
  or in blocks), compressed-tensors (W8A8, W4A16/W8A16, NVFP4), ModelOpt (NVFP4, FP8) and
  MXFP4 (gpt-oss experts) are sized as vLLM keeps them on a CUDA GPU; other
  ``quant_method`` values raise :class:`ConfigError`. Excluded modules are matched by
  vLLM-style names (``model.layers.N.self_attn.q_proj``); a multimodal wrapper's
  ``language_model`` prefix is not reproduced.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping

from servebook.errors import ConfigError
from servebook.model_spec import AttentionLayer, ModelSpec, MoESpec, ParamCount
from servebook.quant_schemes import Quantization
from servebook.quant_schemes import resolve as resolve_quantization

# ---------------------------------------------------------------------------
# Reference configs shipped with the package
# ---------------------------------------------------------------------------

def _models_dir() -> Path:
    """Directory holding the reference ``<id>.json`` configs."""
    return Path(str(resources.files("servebook").joinpath("data", "models")))


def reference_model_ids() -> list[str]:
    """Short ids of the reference models shipped with the package, sorted."""
    return sorted(p.stem for p in _models_dir().glob("*.json"))


def load_reference_config(model_id: str) -> dict:
    """The unmodified public ``config.json`` of a reference model, as a dict."""
    path = _models_dir() / f"{model_id}.json"
    if not path.is_file():
        raise ConfigError(
            f"unknown reference model {model_id!r}; known ids: {', '.join(reference_model_ids())}. "
            "Or pass a path to a config.json (or to a directory holding one)."
        )
    return _read_json(path)


# ---------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------

#: ``architectures[0]`` -> family handled by this module.
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
    "Gemma4ForCausalLM": "gemma4",
    "Gemma4ForConditionalGeneration": "gemma4",
    "GptOssForCausalLM": "gpt_oss",
    "DeepseekV2ForCausalLM": "deepseek",
    "DeepseekV3ForCausalLM": "deepseek",
    "Glm4MoeLiteForCausalLM": "deepseek",
}

#: ``model_type`` -> family, used when ``architectures`` is absent.
_MODEL_TYPES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "mixtral": "mixtral",
    "qwen2_moe": "qwen2_moe",
    "qwen3_moe": "qwen3_moe",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "gemma4": "gemma4",
    "gemma4_text": "gemma4",
    "gpt_oss": "gpt_oss",
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
}


def supported_architectures() -> list[str]:
    """``architectures[0]`` values the loader understands."""
    return sorted(ARCHITECTURES)


# ---------------------------------------------------------------------------
# Reading the config
# ---------------------------------------------------------------------------


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))  # an editor's byte-order mark is no mistake
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); supply the model's config.json unmodified.") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file (not UTF-8 JSON); point at the model's config.json, not its "
                          "weights (.safetensors, .bin, .gguf).") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object (a Hugging Face config.json), not {type(data).__name__}.")
    return data


def _resolve_source(source: Any) -> tuple[dict, str, str]:
    """Turn ``source`` into (config dict, default name, source description)."""
    if isinstance(source, Mapping):
        return dict(source), str(source.get("_name_or_path") or "model"), "dict"
    if not isinstance(source, (str, Path)):
        raise ConfigError(
            f"cannot load a model from a {type(source).__name__}; pass a path to config.json, "
            "a directory holding one, a dict, or a reference id "
            f"({', '.join(reference_model_ids())})."
        )
    text = str(source)
    path = Path(text).expanduser()
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise ConfigError(f"{path} holds no config.json; point at the model directory or the file itself.")
        return _read_json(cfg_path), path.name, str(cfg_path)
    if path.is_file():
        name = path.stem if path.name != "config.json" else path.parent.name
        return _read_json(path), name, str(path)
    if text in reference_model_ids():
        return load_reference_config(text), text, f"reference:{text}"
    raise ConfigError(
        f"{text!r} is neither a file, a directory with a config.json, nor a reference id; "
        f"reference ids: {', '.join(reference_model_ids())}."
    )


def _family(cfg: Mapping) -> tuple[str, str]:
    """(architecture name, family) of a config, or ConfigError listing supported ones."""
    archs = cfg.get("architectures")
    if archs:
        if not isinstance(archs, list) or not isinstance(archs[0], str):
            raise ConfigError('"architectures" must be a list of class names, e.g. ["LlamaForCausalLM"].')
        arch = archs[0]
        if arch in ARCHITECTURES:
            return arch, ARCHITECTURES[arch]
        raise ConfigError(
            f"unsupported architecture {arch!r}; supported: {', '.join(supported_architectures())}."
        )
    model_type = cfg.get("model_type")
    if model_type in _MODEL_TYPES:
        return str(model_type), _MODEL_TYPES[model_type]
    raise ConfigError(
        'config has no "architectures" (and no known "model_type"); add e.g. '
        f'"architectures": ["LlamaForCausalLM"]. Supported: {", ".join(supported_architectures())}.'
    )


class _Fields:
    """Typed, validated access to a (text) config; errors name the field."""

    def __init__(self, cfg: Mapping, where: str):
        self.cfg = cfg
        self.where = where

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        value = self.cfg.get(key)
        return default if value is None else value

    def int(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.cfg.get(key)
        if value is None:
            if default is None:
                raise ConfigError(
                    f"{self.where} lacks {key!r}; add it (an integer) to config.json — "
                    "copy the model's published config.json rather than writing one by hand."
                )
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ConfigError(f"{self.where}: {key!r} must be an integer, got {value!r}.")
        if value < minimum:
            raise ConfigError(f"{self.where}: {key!r} must be >= {minimum}, got {value!r}.")
        return int(value)

    def bool(self, key: str, default: bool = False) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(f"{self.where}: {key!r} must be true or false, got {value!r}.")
        return value


# ---------------------------------------------------------------------------
# Weight tensors
# ---------------------------------------------------------------------------

EMBEDDING = "embedding"
LM_HEAD = "lm_head"
ATTENTION = "attention"
MLP_DENSE = "mlp_dense"
EXPERTS = "experts"
OTHER = "norms_and_other"


@dataclass(frozen=True)
class _Tensor:
    """One weight tensor (or ``copies`` identical ones, e.g. routed experts).

    ``linear`` marks 2-D projection weights (rows = output, cols = input), the
    tensors quantization schemes convert. ``active_copies`` is how many of the
    copies one token uses (top-k of the routed experts); None means all.
    """

    category: str
    rows: int
    cols: int = 1
    copies: int = 1
    linear: bool = False
    active_copies: int | None = None
    #: the projection's name inside its block as vLLM names it (``q_proj``, ``down_proj``,
    #: ``experts``); "" when not named. Quantization configs exclude modules by these names.
    module: str = ""
    #: False for a tensor the engine allocates but the checkpoint does not hold (Gemma 4's V slot
    #: on K=V layers): it counts in the weight bytes, not in the parameter count.
    in_checkpoint: bool = True

    @property
    def numel(self) -> int:
        return self.rows * self.cols * self.copies

    @property
    def active_numel(self) -> int:
        copies = self.copies if self.active_copies is None else self.active_copies
        return self.rows * self.cols * copies


def _linear(category: str, out_features: int, in_features: int, bias: bool = False, **kw) -> list[_Tensor]:
    """A linear layer: its weight, plus a bias vector when ``bias`` (``module`` names the weight)."""
    module = kw.pop("module", "")
    out = [_Tensor(category, out_features, in_features, linear=True, module=module, **kw)]
    if bias:
        out.append(_Tensor(category, out_features, copies=kw.get("copies", 1), active_copies=kw.get("active_copies")))
    return out


def _gated_mlp(category: str, hidden: int, inter: int, **kw) -> list[_Tensor]:
    """gate_proj + up_proj + down_proj (SwiGLU / GeGLU), no biases."""
    return (
        _linear(category, inter, hidden, module="gate_proj", **kw)
        + _linear(category, inter, hidden, module="up_proj", **kw)
        + _linear(category, hidden, inter, module="down_proj", **kw)
    )


# ---------------------------------------------------------------------------
# Per-family description
# ---------------------------------------------------------------------------


@dataclass
class _Layer:
    """One decoder layer: its cache shape and its tensors; ``moe`` if it routes experts."""

    attention: AttentionLayer
    tensors: list[_Tensor]
    moe: bool = False


@dataclass
class _Model:
    layers: list[_Layer]
    global_tensors: list[_Tensor]
    moe: MoESpec | None
    intermediate_size: int


#: Fields that published configs may omit because they equal the defaults of
#: transformers' config class (e.g. google/gemma-3-27b-it's text_config has no
#: vocab_size). Filled only when absent, exactly as transformers would.
_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3": {  # transformers Gemma3TextConfig
        "vocab_size": 262_208,
        "max_position_embeddings": 131_072,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
    },
}


def _text_config(cfg: Mapping, family: str) -> tuple[dict, str]:
    """The decoder's config: ``text_config`` for multimodal wrappers, else the top level.

    Class defaults (:data:`_CLASS_DEFAULTS`) fill fields the file omits.
    """
    text, where = _raw_text_config(cfg, family)
    for key, value in _CLASS_DEFAULTS.get(family, {}).items():
        if text.get(key) is None:
            text[key] = value
    return text, where


def decoder_config(cfg: Mapping) -> dict:
    """The decoder's config as transformers reads it: ``text_config`` of a multimodal wrapper (else
    the top level), with the fields a published file may omit filled from the config class's
    defaults (e.g. Gemma 3's ``vocab_size``, 262,208). Raises ConfigError for an unsupported
    architecture.
    """
    _, family = _family(cfg)
    return _text_config(cfg, family)[0]


def _raw_text_config(cfg: Mapping, family: str) -> tuple[dict, str]:
    text = cfg.get("text_config")
    if isinstance(text, Mapping):
        return dict(text), "config.json text_config"
    if family in ("gemma3", "gemma4") and cfg.get("architectures", [""])[0].endswith("ConditionalGeneration"):
        raise ConfigError(
            "a *ForConditionalGeneration config needs a \"text_config\" object holding the language model's "
            "shape (hidden_size, num_hidden_layers, ...); supply the published config.json."
        )
    return dict(cfg), "config.json"


def _head_dim(f: _Fields) -> int:
    """``head_dim`` when given (Qwen3, Gemma), else hidden_size / num_attention_heads."""
    if f.has("head_dim"):
        return f.int("head_dim")
    hidden, heads = f.int("hidden_size"), f.int("num_attention_heads")
    if hidden % heads:
        raise ConfigError(
            f"{f.where}: hidden_size {hidden} is not divisible by num_attention_heads {heads}; add \"head_dim\"."
        )
    return hidden // heads


def _layer_types(f: _Fields, num_layers: int, default: Callable[[int], str] | None) -> list[str]:
    """``layer_types`` from the config, else ``default(i)`` for each layer, else all full."""
    types = f.raw("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers:
            raise ConfigError(
                f"{f.where}: layer_types must list one entry per layer ({num_layers}), "
                f"got {len(types) if isinstance(types, list) else types!r}."
            )
        unknown = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
        if unknown:
            raise ConfigError(
                f"{f.where}: layer_types {unknown} are not supported; "
                "only 'full_attention' and 'sliding_attention' layers are modelled."
            )
        return list(types)
    if default is None:
        return ["full_attention"] * num_layers
    return [default(i) for i in range(num_layers)]


def _window(f: _Fields) -> int:
    return f.int("sliding_window")


def _kv_sources(f: _Fields, types: list[str]) -> list[int | None]:
    """Cross-layer KV sharing (Gemma 3n/4 ``num_kv_shared_layers``): each consumer's source layer."""
    n = len(types)
    shared = f.int("num_kv_shared_layers", 0, minimum=0)
    if shared == 0:
        return [None] * n
    if shared >= n:
        raise ConfigError(f"{f.where}: num_kv_shared_layers ({shared}) must be smaller than num_hidden_layers ({n}).")
    first = n - shared
    sources: list[int | None] = [None] * n
    for i in range(first, n):
        producers = [j for j in range(first) if types[j] == types[i]]
        if not producers:
            raise ConfigError(
                f"{f.where}: layer {i} ({types[i]}) shares KV but no earlier unshared layer has that type."
            )
        sources[i] = producers[-1]
    return sources


def _gqa_attention_tensors(
    f: _Fields,
    *,
    num_kv_heads: int,
    head_dim: int,
    qkv_bias: bool,
    o_bias: bool,
    qk_norm: bool,
    has_v: bool = True,
    v_in_checkpoint: bool = True,
    owns_kv: bool = True,
) -> list[_Tensor]:
    """q/k/v/o projections (+ biases, q/k norms) of a grouped-query attention layer.

    ``v_in_checkpoint=False``: the V projection is allocated (``has_v``) but not stored."""
    hidden = f.int("hidden_size")
    q_heads = f.int("num_attention_heads")
    t = _linear(ATTENTION, q_heads * head_dim, hidden, qkv_bias, module="q_proj")
    if owns_kv:
        t += _linear(ATTENTION, num_kv_heads * head_dim, hidden, qkv_bias, module="k_proj")
        if has_v:
            v = _linear(ATTENTION, num_kv_heads * head_dim, hidden, qkv_bias, module="v_proj")
            t += [replace(x, in_checkpoint=v_in_checkpoint) for x in v]
    t += _linear(ATTENTION, hidden, q_heads * head_dim, o_bias, module="o_proj")
    if qk_norm:
        t.append(_Tensor(ATTENTION, head_dim))  # q_norm
        if owns_kv:
            t.append(_Tensor(ATTENTION, head_dim))  # k_norm
    return t


def _norms(hidden: int, count: int) -> list[_Tensor]:
    return [_Tensor(OTHER, hidden, copies=count)]


def _embeddings(f: _Fields, tied: bool) -> list[_Tensor]:
    vocab, hidden = f.int("vocab_size"), f.int("hidden_size")
    out = [_Tensor(EMBEDDING, vocab, hidden)]
    if not tied:
        out.append(_Tensor(LM_HEAD, vocab, hidden, linear=True))
    out += _norms(hidden, 1)  # final norm
    return out


# --- Llama, Mistral, Qwen2/3, Mixtral, Qwen MoE -----------------------------


def _llama_like(f: _Fields, family: str, tied: bool) -> _Model:
    n = f.int("num_hidden_layers")
    hidden = f.int("hidden_size")
    kv = f.int("num_key_value_heads", f.int("num_attention_heads"))
    hd = _head_dim(f)

    if family in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        # Qwen: sliding only when use_sliding_window, and only from max_window_layers on.
        use_swa = f.bool("use_sliding_window") and f.has("sliding_window")
        max_window_layers = f.int("max_window_layers", n, minimum=0)
        default = lambda i: "sliding_attention" if use_swa and i >= max_window_layers else "full_attention"  # noqa: E731
    else:
        # Mistral-7B-v0.1 declares a window that applies to every layer; Llama/Mixtral use null.
        default = (lambda i: "sliding_attention") if f.has("sliding_window") else None  # noqa: E731
    types = _layer_types(f, n, default)

    qkv_bias = f.bool("attention_bias") or family in ("qwen2", "qwen2_moe")
    o_bias = f.bool("attention_bias")
    qk_norm = family in ("qwen3", "qwen3_moe")
    moe, moe_layers = _llama_moe(f, family, n)

    layers = []
    for i, kind in enumerate(types):
        sliding = kind == "sliding_attention"
        attn = AttentionLayer("sliding" if sliding else "full", kv, hd, hd, _window(f) if sliding else None)
        tensors = _gqa_attention_tensors(f, num_kv_heads=kv, head_dim=hd, qkv_bias=qkv_bias, o_bias=o_bias, qk_norm=qk_norm)
        tensors += _norms(hidden, 2)
        if i in moe_layers:
            tensors += _routed_experts(hidden, moe, bias=False)
            tensors.append(_Tensor(OTHER, moe.num_experts, hidden))  # router gate
            if moe.shared_intermediate_size:
                tensors += _gated_mlp(MLP_DENSE, hidden, moe.shared_intermediate_size)
                tensors.append(_Tensor(OTHER, 1, hidden))  # shared_expert_gate
        else:
            inter = f.int("intermediate_size")
            tensors += _gated_mlp(MLP_DENSE, hidden, inter)
            if f.bool("mlp_bias"):
                tensors.append(_Tensor(MLP_DENSE, 2 * inter + hidden))  # gate, up, down biases
        layers.append(_Layer(attn, tensors, i in moe_layers))
    dense_inter = f.int("intermediate_size") if len(moe_layers) < n else 0
    return _Model(layers, _embeddings(f, tied), moe, dense_inter)


def _llama_moe(f: _Fields, family: str, n: int) -> tuple[MoESpec | None, set[int]]:
    hidden = f.int("hidden_size")
    if family == "mixtral":
        experts, inter = f.int("num_local_experts"), f.int("intermediate_size")
        moe_layers = set(range(n))
        shared = 0
    elif family in ("qwen2_moe", "qwen3_moe"):
        # transformers >= 5 writes num_local_experts; published Qwen configs say num_experts.
        experts_key = "num_experts" if f.has("num_experts") or not f.has("num_local_experts") else "num_local_experts"
        experts, inter = f.int(experts_key), f.int("moe_intermediate_size")
        step = f.int("decoder_sparse_step", 1)
        only_mlp = set(f.raw("mlp_only_layers", []) or [])
        moe_layers = {i for i in range(n) if i not in only_mlp and (i + 1) % step == 0}
        shared = f.int("shared_expert_intermediate_size", 0, minimum=0) if family == "qwen2_moe" else 0
    else:
        return None, set()
    k = f.int("num_experts_per_tok")
    _check_top_k(f, k, experts)
    spec = MoESpec(
        num_experts=experts,
        experts_per_token=k,
        expert_intermediate_size=inter,
        num_shared_experts=1 if shared else 0,
        shared_intermediate_size=shared,
        moe_layer_indices=tuple(sorted(moe_layers)),
        params_per_expert=3 * hidden * inter,
    )
    return spec, moe_layers


def _check_top_k(f: _Fields, k: int, experts: int) -> None:
    if k > experts:
        raise ConfigError(f"{f.where}: experts per token ({k}) exceeds the number of experts ({experts}).")


def _routed_experts(hidden: int, moe: MoESpec, bias: bool) -> list[_Tensor]:
    """All routed experts of one MoE layer (gate, up, down; optional biases)."""
    e, k, inter = moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size
    kw = dict(copies=e, active_copies=k)
    return (
        _linear(EXPERTS, inter, hidden, bias, module="experts", **kw)
        + _linear(EXPERTS, inter, hidden, bias, module="experts.up_proj", **kw)   # fused into w13
        + _linear(EXPERTS, hidden, inter, bias, module="experts", **kw)
    )


# --- Gemma 3 / Gemma 4 -------------------------------------------------------


def _gemma(f: _Fields, family: str, tied: bool) -> _Model:
    n = f.int("num_hidden_layers")
    hidden = f.int("hidden_size")
    kv = f.int("num_key_value_heads", f.int("num_attention_heads"))
    hd = _head_dim(f)
    pattern = f.int("sliding_window_pattern", 6)
    types = _layer_types(f, n, lambda i: "sliding_attention" if (i + 1) % pattern else "full_attention")
    qkv_bias = o_bias = f.bool("attention_bias")

    if family == "gemma4":
        # transformers forces Gemma 4's last layer to full attention.
        types[-1] = "full_attention"
        k_eq_v = f.bool("attention_k_eq_v")
        global_hd = f.int("global_head_dim", 512)
        global_kv = kv
        if f.has("num_global_key_value_heads") and (k_eq_v or "attention_k_eq_v" not in f.cfg):
            global_kv = f.int("num_global_key_value_heads")
    sources = _kv_sources(f, types)
    moe = _gemma4_moe(f, n) if family == "gemma4" else None
    overrides = _per_layer_overrides(f, n) if family == "gemma4" else {}

    layers = []
    for i, kind in enumerate(types):
        sliding = kind == "sliding_attention"
        layer_kv, layer_hd, has_v = kv, hd, True
        if family == "gemma4" and not sliding:
            layer_kv, layer_hd, has_v = global_kv, global_hd, not k_eq_v
        if i in overrides:
            layer_kv = overrides[i].get("num_key_value_heads", layer_kv)
            layer_hd = overrides[i].get("head_dim", layer_hd)
        attn = AttentionLayer(
            "sliding" if sliding else "full",
            layer_kv,
            layer_hd,
            layer_hd if has_v else 0,
            _window(f) if sliding else None,
            sources[i],
        )
        tensors = _gqa_attention_tensors(
            f,
            num_kv_heads=layer_kv,
            head_dim=layer_hd,
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            qk_norm=True,
            # vLLM's Gemma 4 builds one QKVParallelLinear for every layer, K=V layers included, and
            # loads the K weights into the V slot too (gemma4.py, "no structural difference needed"):
            # the V projection is allocated whether or not the checkpoint has one.
            has_v=True,
            v_in_checkpoint=has_v,
            owns_kv=sources[i] is None,
        )
        tensors += _norms(hidden, 4)  # input, post-attention, pre- and post-feedforward
        if family == "gemma4":
            tensors.append(_Tensor(OTHER, 1))  # layer_scalar, stored in the checkpoint
        inter = f.int("intermediate_size")
        if family == "gemma4" and sources[i] is not None and f.bool("use_double_wide_mlp"):
            inter *= 2
        tensors += _gated_mlp(MLP_DENSE, hidden, inter)
        if moe is not None:
            tensors += _routed_experts(hidden, moe, bias=False)
            # router: projection, input scale, per-expert scale; three extra norms.
            tensors += [_Tensor(OTHER, moe.num_experts, hidden), _Tensor(OTHER, hidden), _Tensor(OTHER, moe.num_experts)]
            tensors += _norms(hidden, 3)
        layers.append(_Layer(attn, tensors, moe is not None))

    globals_ = _embeddings(f, tied)
    per_layer = f.int("hidden_size_per_layer_input", 0, minimum=0) if family == "gemma4" else 0
    if per_layer:
        # Gemma 4 E-models: per-layer embeddings, a projection into them, and a norm;
        # plus a gate, projection and norm in every layer.
        vocab_pl = f.int("vocab_size_per_layer_input", f.int("vocab_size"))
        globals_ += [
            _Tensor(EMBEDDING, vocab_pl, n * per_layer),
            _Tensor(OTHER, n * per_layer, hidden, linear=True),
            _Tensor(OTHER, per_layer),
        ]
        for layer in layers:
            layer.tensors += [
                _Tensor(OTHER, per_layer, hidden, linear=True),
                _Tensor(OTHER, hidden, per_layer, linear=True),
                _Tensor(OTHER, hidden),
            ]
    return _Model(layers, globals_, moe, 0 if moe is not None else f.int("intermediate_size"))


def _per_layer_overrides(f: _Fields, n: int) -> dict[int, dict[str, int]]:
    """``per_layer_config`` (as transformers >= 5 serialises Gemma 4): layer index -> head_dim / KV heads."""
    table = f.raw("per_layer_config")
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise ConfigError(f"{f.where}: per_layer_config must map layer indices to overrides, got {table!r}.")
    out: dict[int, dict[str, int]] = {}
    for key, value in table.items():
        try:
            index = int(key)
        except (TypeError, ValueError):
            raise ConfigError(f"{f.where}: per_layer_config key {key!r} is not a layer index.") from None
        if not 0 <= index < n or not isinstance(value, Mapping):
            raise ConfigError(f"{f.where}: per_layer_config entry {key!r} must name a layer 0..{n - 1} with an object.")
        sub = _Fields(value, f"{f.where} per_layer_config[{key}]")
        out[index] = {k: sub.int(k) for k in ("head_dim", "num_key_value_heads") if sub.has(k)}
    return out


def _gemma4_moe(f: _Fields, n: int) -> MoESpec | None:
    if not f.bool("enable_moe_block"):
        return None
    experts = f.int("num_experts")
    k = f.int("top_k_experts")
    _check_top_k(f, k, experts)
    inter = f.int("moe_intermediate_size")
    hidden = f.int("hidden_size")
    # Every Gemma 4 MoE layer also runs its dense MLP (intermediate_size) on every token:
    # described as one always-active shared expert.
    return MoESpec(experts, k, inter, 1, f.int("intermediate_size"), tuple(range(n)), 3 * hidden * inter)


# --- gpt-oss -----------------------------------------------------------------


def _gpt_oss(f: _Fields, tied: bool) -> _Model:
    n = f.int("num_hidden_layers")
    hidden = f.int("hidden_size")
    kv = f.int("num_key_value_heads")
    hd = _head_dim(f)
    q_heads = f.int("num_attention_heads")
    types = _layer_types(f, n, lambda i: "sliding_attention" if i % 2 == 0 else "full_attention")
    experts = f.int("num_local_experts")
    k = f.int("num_experts_per_tok", f.int("experts_per_token", 4))
    _check_top_k(f, k, experts)
    inter = f.int("intermediate_size")
    # Each expert: fused gate_up (2*inter x hidden) + bias, down (hidden x inter) + bias.
    per_expert = 3 * hidden * inter + 2 * inter + hidden
    moe = MoESpec(experts, k, inter, 0, 0, tuple(range(n)), per_expert)
    bias = f.bool("attention_bias", True)
    layers = []
    for kind in types:
        sliding = kind == "sliding_attention"
        attn = AttentionLayer("sliding" if sliding else "full", kv, hd, hd, _window(f) if sliding else None)
        tensors = _gqa_attention_tensors(f, num_kv_heads=kv, head_dim=hd, qkv_bias=bias, o_bias=bias, qk_norm=False)
        tensors.append(_Tensor(ATTENTION, q_heads))  # attention sinks, one per query head
        tensors += _norms(hidden, 2)
        tensors += _routed_experts(hidden, moe, bias=True)
        tensors += _linear(OTHER, experts, hidden, bias=True)  # router
        layers.append(_Layer(attn, tensors, True))
    return _Model(layers, _embeddings(f, tied), moe, 0)


# --- DeepSeek V2 / V3 (multi-head latent attention) ---------------------------


def _deepseek(f: _Fields, tied: bool) -> _Model:
    n = f.int("num_hidden_layers")
    hidden = f.int("hidden_size")
    heads = f.int("num_attention_heads")
    kv_rank = f.int("kv_lora_rank")
    rope = f.int("qk_rope_head_dim")
    nope = f.int("qk_nope_head_dim")
    v_hd = f.int("v_head_dim")
    q_rank = f.raw("q_lora_rank")
    latent = kv_rank + rope

    attn_tensors: list[_Tensor] = []
    if q_rank is None:  # V2-Lite: plain q projection
        attn_tensors += _linear(ATTENTION, heads * (nope + rope), hidden)
    else:
        q_rank = f.int("q_lora_rank")
        attn_tensors += _linear(ATTENTION, q_rank, hidden) + [_Tensor(ATTENTION, q_rank)]
        attn_tensors += _linear(ATTENTION, heads * (nope + rope), q_rank)
    attn_tensors += _linear(ATTENTION, latent, hidden)  # kv_a_proj_with_mqa
    attn_tensors.append(_Tensor(ATTENTION, kv_rank))  # kv_a_layernorm
    attn_tensors += _linear(ATTENTION, heads * (nope + v_hd), kv_rank)  # kv_b_proj
    attn_tensors += _linear(ATTENTION, hidden, heads * v_hd)  # o_proj

    experts = f.int("n_routed_experts", 0, minimum=0)
    moe: MoESpec | None = None
    moe_layers: set[int] = set()
    if experts:
        first_dense = f.int("first_k_dense_replace", 0, minimum=0)
        freq = f.int("moe_layer_freq", 1)
        moe_layers = {i for i in range(n) if i >= first_dense and i % freq == 0}
        k = f.int("num_experts_per_tok")
        _check_top_k(f, k, experts)
        inter = f.int("moe_intermediate_size")
        n_shared = f.int("n_shared_experts", 0, minimum=0)
        moe = MoESpec(experts, k, inter, n_shared, n_shared * inter, tuple(sorted(moe_layers)), 3 * hidden * inter)
    noaux = f.raw("topk_method") == "noaux_tc"

    layers = []
    for i in range(n):
        attn = AttentionLayer("mla", 1, latent, 0)
        tensors = list(attn_tensors) + _norms(hidden, 2)
        if i in moe_layers:
            tensors += _routed_experts(hidden, moe, bias=False)
            if moe.shared_intermediate_size:
                tensors += _gated_mlp(MLP_DENSE, hidden, moe.shared_intermediate_size)
            tensors.append(_Tensor(OTHER, experts, hidden))  # router gate (kept in 16-bit)
            if noaux:
                tensors.append(_Tensor(OTHER, experts))  # e_score_correction_bias
        else:
            tensors += _gated_mlp(MLP_DENSE, hidden, f.int("intermediate_size"))
        layers.append(_Layer(attn, tensors, i in moe_layers))
    return _Model(layers, _embeddings(f, tied), moe, f.int("intermediate_size") if len(moe_layers) < n else 0)


# ---------------------------------------------------------------------------
# Bytes as loaded
# ---------------------------------------------------------------------------

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 2, "float": 2, "fp8": 1}
#: MXFP4: 4-bit values plus one 8-bit (E8M0) scale per 32 values = 4.25 bits = 17/32 byte.
MXFP4_BYTES_PER_PARAM = 17 / 32


def _dtype(cfg: Mapping, text: Mapping) -> str:
    value = text.get("torch_dtype") or text.get("dtype") or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    value = str(value).replace("torch.", "")
    if value not in _DTYPE_BYTES:
        raise ConfigError(f"torch_dtype {value!r} is not supported; use one of {', '.join(sorted(_DTYPE_BYTES))}.")
    return value


#: Where a tensor of each category sits in vLLM's module tree, for its dotted name.
_BLOCK = {ATTENTION: "self_attn", MLP_DENSE: "mlp", EXPERTS: "mlp", OTHER: ""}


def _module_name(layer: int | None, t: _Tensor) -> str:
    """A vLLM-style dotted name (``model.layers.3.self_attn.q_proj``) that exclusion lists match."""
    if t.category == EMBEDDING:
        return "model.embed_tokens"
    if t.category == LM_HEAD:
        return "lm_head"
    parts = ["model"] + ([f"layers.{layer}"] if layer is not None else [])
    parts += [p for p in (_BLOCK.get(t.category, ""), t.module) if p]
    return ".".join(parts)


def _named(model: _Model) -> list[tuple[str, _Tensor]]:
    """Every tensor with its module name (global tensors first, then layer by layer)."""
    out = [(_module_name(None, t), t) for t in model.global_tensors]
    for i, layer in enumerate(model.layers):
        out += [(_module_name(i, t), t) for t in layer.tensors]
    return out


#: Projections vLLM fuses into the one before them (same input): qkv_proj, gate_up_proj, the experts' w13.
_FUSED_INTO_PREVIOUS = frozenset({"k_proj", "v_proj", "up_proj", "experts.up_proj"})


def _is_quantized(q: Quantization, name: str, t: _Tensor) -> bool:
    """Whether vLLM quantizes this tensor: 2-D projections of the decoder layers (the LM head only
    when the config says so, embeddings never), less the modules the config excludes."""
    if not t.linear or t.category == EMBEDDING:
        return False
    if t.category == LM_HEAD and not q.lm_head:
        return False
    if q.experts_only and t.category != EXPERTS:
        return False
    return not q.skips(name)


def _weight_bytes(named: list[tuple[str, _Tensor]], dtype: str, quant: Mapping | None) -> int:
    """Bytes of all weights as the engine keeps them on a CUDA GPU after loading.

    * no quantization_config: every tensor at the served 16-bit width;
    * otherwise (:func:`servebook.quant_schemes.resolve`): each quantized projection at
      :meth:`~servebook.quant_schemes.Quantization.matrix_bytes` (packed values, scales, zero
      points, act-order indices) times its copies (routed experts); everything else 16-bit:
      embeddings, norms, routers, biases, the LM head (unless quantized) and excluded modules
      (``modules_to_not_convert``, ``ignore``, ``exclude_modules``). MXFP4 (gpt-oss) converts
      the routed experts only; block ``fp8`` (DeepSeek-V3) every projection but the head.
    """
    base = _DTYPE_BYTES[dtype]
    q = resolve_quantization(quant)
    if q is None:
        return sum(t.numel for _, t in named) * base
    total = 0
    for name, t in named:
        if _is_quantized(q, name, t):
            total += q.matrix_bytes(t.rows, t.cols, owns_g_idx=t.module not in _FUSED_INTO_PREVIOUS) * t.copies
        else:
            total += t.numel * 2
    return total


# ---------------------------------------------------------------------------
# Public entry point
# ---------------------------------------------------------------------------


def _describe(cfg: dict) -> tuple[str, str, dict, _Fields, _Model]:
    arch, family = _family(cfg)
    text, where = _text_config(cfg, family)
    f = _Fields(text, where)
    tied_default = family in ("gemma3", "gemma4")
    tied = bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", tied_default)))
    if family in ("llama", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"):
        model = _llama_like(f, family, tied)
    elif family in ("gemma3", "gemma4"):
        model = _gemma(f, family, tied)
    elif family == "gpt_oss":
        model = _gpt_oss(f, tied)
    else:
        model = _deepseek(f, tied)
    return arch, family, text, f, model


def _param_count(model: _Model) -> ParamCount:
    """Parameters the checkpoint holds; those the engine only allocates in ``engine_only``."""
    every = model.global_tensors + [t for layer in model.layers for t in layer.tensors]
    tensors = [t for t in every if t.in_checkpoint]
    by_cat = {c: 0 for c in (EMBEDDING, LM_HEAD, ATTENTION, MLP_DENSE, EXPERTS, OTHER)}
    for t in tensors:
        by_cat[t.category] += t.numel
    return ParamCount(
        total=sum(by_cat.values()),
        active=sum(t.active_numel for t in tensors),
        embedding=by_cat[EMBEDDING],
        lm_head=by_cat[LM_HEAD],
        attention=by_cat[ATTENTION],
        mlp_dense=by_cat[MLP_DENSE],
        experts=by_cat[EXPERTS],
        norms_and_other=by_cat[OTHER],
        engine_only=sum(t.numel for t in every if not t.in_checkpoint),
    )


def load_model_spec(source: str | Path | Mapping, name: str | None = None) -> ModelSpec:
    """Load a :class:`ModelSpec` from a config.json.

    Args:
        source: path to a ``config.json``; a directory holding one; the config
            as a dict; or a reference id such as ``"llama-3.1-8b"`` (see
            :func:`reference_model_ids`).
        name: display name; defaults to the reference id, the directory name
            or ``_name_or_path``.

    Raises:
        ConfigError: the config is malformed, lacks a field (the message names
            it), or describes an unsupported architecture (the message lists the
            supported ones).
    """
    cfg, default_name, where = _resolve_source(source)
    arch, _family_name, text, f, model = _describe(cfg)
    _check_head_groups(f, model)
    named = _named(model)
    dtype = _dtype(cfg, text)
    quant = cfg.get("quantization_config") or text.get("quantization_config")
    return ModelSpec(
        name=name or default_name,
        architecture=arch,
        hidden_size=f.int("hidden_size"),
        num_attention_heads=f.int("num_attention_heads"),
        vocab_size=f.int("vocab_size"),
        max_position_embeddings=f.int("max_position_embeddings", 0, minimum=0),
        layers=tuple(layer.attention for layer in model.layers),
        params=_param_count(model),
        weight_bytes=_weight_bytes(named, dtype, quant),
        buffer_bytes=_buffer_bytes(text, model, dtype),
        moe=_with_expert_bytes(model.moe, named, dtype, quant),
        tie_word_embeddings=not any(t.category == LM_HEAD for _, t in named),
        intermediate_size=model.intermediate_size,
        torch_dtype=dtype,
        source=where,
        raw=cfg,
    )


def _buffer_bytes(text: Mapping, model: _Model, dtype: str) -> int:
    """Bytes of the non-weight tensors vLLM allocates while loading: the rotary caches
    (:mod:`servebook.rotary_cache`)."""
    from servebook.rotary_cache import rotary_cache_bytes

    layer_heads = [("sliding_attention" if layer.attention.kind == "sliding" else "full_attention",
                    layer.attention.head_dim) for layer in model.layers]
    mla = text.get("qk_rope_head_dim") if any(layer.attention.kind == "mla" for layer in model.layers) else None
    return rotary_cache_bytes(text, layer_heads, dtype_bytes=4 if dtype == "float32" else 2,
                              mla_rope_dim=int(mla) if mla else None)


def _check_head_groups(f: _Fields, model: _Model) -> None:
    """Refuse KV heads that do not group the query heads evenly (grouped-query attention).

    Every KV head serves ``num_attention_heads / num_key_value_heads`` query heads, so the KV
    heads must divide the query heads (transformers' ``repeat_kv``; vLLM's attention modules
    split ``num_heads // num_kv_heads``). MLA layers have no KV heads.
    """
    heads = f.int("num_attention_heads")
    for index, layer in enumerate(model.layers):
        attn = layer.attention
        if attn.kind == "mla" or not attn.owns_cache:
            continue
        kv = attn.num_kv_heads
        if kv > heads or heads % kv:
            fix = [d for d in range(1, heads + 1) if heads % d == 0]
            raise ConfigError(
                f"{f.where}: layer {index} has {kv} KV heads, which do not divide the {heads} attention heads "
                f"(num_attention_heads); each KV head serves a whole group of query heads, so fix "
                f"num_key_value_heads (a divisor of {heads}: {', '.join(map(str, fix))}) or num_attention_heads "
                "-- copy the model's published config.json")


def _with_expert_bytes(moe: MoESpec | None, named: list[tuple[str, _Tensor]], dtype: str,
                       quant: Mapping | None):
    """``moe`` with ``bytes_per_param`` of its routed-expert matrices as the engine loads them."""
    experts = [(n, t) for n, t in named if t.category == EXPERTS]
    values = sum(t.numel for _, t in experts)
    if moe is None or not values:
        return moe
    return replace(moe, bytes_per_param=_weight_bytes(experts, dtype, quant) / values)


def spec_quantization(spec: ModelSpec) -> Quantization | None:
    """The checkpoint's quantization (:func:`servebook.quant_schemes.resolve`), None for 16-bit weights."""
    raw = spec.raw or {}
    text = raw.get("text_config") if isinstance(raw.get("text_config"), Mapping) else {}
    return resolve_quantization(raw.get("quantization_config") or text.get("quantization_config"))


def active_matmul_params(spec: ModelSpec) -> int:
    """Parameters one token is multiplied by: ``params.active`` minus the input embedding.

    The input embedding is a table lookup (one row per token, no FLOPs), so
    compute models should use this number. When the head is tied to the
    embedding the matrix is used as the head and stays counted. Publishers
    differ: OpenAI (gpt-oss) and DeepSeek quote active parameters this way,
    Mistral (Mixtral) and Qwen include the embedding (``params.active``).
    """
    if spec.tie_word_embeddings:
        return spec.params.active
    return spec.params.active - spec.params.embedding


def mtp_params(source: str | Path | Mapping) -> int:
    """Parameters of DeepSeek's multi-token-prediction module(s), not counted in the served model.

    One MTP module = one MoE decoder layer + two norms (enorm, hnorm) + a
    2*hidden -> hidden projection + its own head norm, and (as stored in the
    checkpoint) its own copy of the embedding and the output head. Returns 0
    for models without ``num_nextn_predict_layers``.
    """
    cfg, _, _ = _resolve_source(source)
    arch, family, text, f, model = _describe(cfg)
    count = f.int("num_nextn_predict_layers", 0, minimum=0)
    if not count:
        return 0
    moe_layer = next((l for l in model.layers if l.moe), model.layers[-1])
    hidden, vocab = f.int("hidden_size"), f.int("vocab_size")
    layer = sum(t.numel for t in moe_layer.tensors)
    per_module = layer + 3 * hidden + 2 * hidden * hidden + 2 * vocab * hidden
    return count * per_module
