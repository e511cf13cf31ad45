"""Tiny local model directories for engines with ``load_format="dummy"``.

No weights are downloaded anywhere in this project: an engine loads random weights
of the right shapes, which is all the memory, batching and timing behaviour needs.
A directory holds ``config.json`` (any architecture, e.g. a reference config) and,
when the ``tokenizers`` library is importable, a small word-level tokenizer so that
``vllm serve`` and ``vllm bench serve`` work offline.
"""
from __future__ import annotations

import json
from pathlib import Path

#: A two-layer Llama small enough for a 2-core CPU engine (about 1 M parameters).
TINY_LLAMA_CONFIG: dict = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
    "attention_bias": False,
    "mlp_bias": False,
    "initializer_range": 0.02,
}

_SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
_WORDS = (
    "hello world the a an is are was of to and in on for with you i it this that what who how "
    "why when where yes no ok good bad model test vllm gpu tell me about story once upon time "
    "there lived cat dog cache page block token batch prefill decode"
).split()
_CHARS = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?;:'\"-()/")


def _write_tokenizer(out: Path, vocab_size: int, max_len: int) -> bool:
    """Write a word-level tokenizer; returns False when ``tokenizers`` is not installed."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    except ImportError:
        return False
    vocab: dict[str, int] = {}
    for token in _SPECIALS + _WORDS + _CHARS:
        vocab.setdefault(token, len(vocab))
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(vocab)} tokens")
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    tok.save(str(out / "tokenizer.json"))
    template = (
        "{% for m in messages %}{{ '<|' + m['role'] + '|> ' + m['content'] + ' ' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}"
    )
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "</s>", "model_max_length": max_len,
        "add_bos_token": True, "chat_template": template,
    }, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>"}, indent=1))
    return True


def write_model_dir(out: str | Path, config: dict | None = None, *, tokenizer: bool = True) -> Path:
    """Write ``config.json`` (default: :data:`TINY_LLAMA_CONFIG`) and a tokenizer into ``out``.

    Returns the directory. ``tokenizer=False`` writes the config only (then start the
    engine with ``skip_tokenizer_init=True`` and token-id prompts).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(config or TINY_LLAMA_CONFIG)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    if tokenizer:
        text_cfg = cfg.get("text_config", cfg)
        _write_tokenizer(out, int(text_cfg.get("vocab_size", 512)), int(text_cfg.get("max_position_embeddings", 4096)))
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id") if k in cfg}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=1))
    return out


def language_model_config(config: dict) -> dict:
    """The text-only config of a multimodal checkpoint (``text_config`` as a ``*ForCausalLM``).

    Gemma 3 and Gemma 4 ship as ``*ForConditionalGeneration`` with the decoder under
    ``text_config``. The decoder's shapes, and so its weights and KV cache, are the same
    in the text-only class; the vision tower (hundreds of MB) is left out. Configs
    without ``text_config`` are returned unchanged.
    """
    text = config.get("text_config")
    arch = (config.get("architectures") or [""])[0]
    if not text or not arch.endswith("ForConditionalGeneration"):
        return dict(config)
    out = dict(text)
    out["architectures"] = [arch.replace("ForConditionalGeneration", "ForCausalLM")]
    for key in ("torch_dtype", "dtype", "bos_token_id", "eos_token_id", "pad_token_id"):
        if key in config and key not in out:
            out[key] = config[key]
    return out
