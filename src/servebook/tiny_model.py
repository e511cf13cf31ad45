"""Tiny local model directories for engines with ``load_format="dummy"``.

No weights are downloaded anywhere in this project: an engine loads random weights
of the right shapes, which is all the memory, batching and timing behaviour needs.
A directory holds ``config.json`` (any architecture, e.g. a reference config) and,
when the ``tokenizers`` library is importable, a word-level tokenizer with the model's
vocabulary size so that ``vllm serve`` and ``vllm bench serve`` work offline.
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


#: The most tokens :func:`_write_tokenizer` writes (Gemma 4's vocabulary; 262,144 entries take
#: well under a second to write). Models with larger vocabularies get this many tokens: their
#: higher ids simply never occur in prompts built from the tokenizer.
MAX_TOKENIZER_VOCAB = 262_144


def synthetic_word(token_id: int) -> str:
    """The text of a filler token: ``w`` and its id (``w1234`` is id 1234).

    Letters and digits only, so the tokenizer's WhitespaceSplit + Punctuation pre-tokenizer
    keeps it whole and the WordPiece decoder leaves it alone: decode then encode gives the id back.
    """
    return f"w{token_id}"


def tokenizer_vocab(vocab_size: int) -> dict[str, int]:
    """``{token: id}`` of the tokenizer :func:`write_model_dir` writes for a ``vocab_size`` model.

    Ids 0-5 are the special tokens (``<unk>``, ``<s>``, ``</s>``, chat roles), then a few English
    words, then single characters (about 130 tokens, the same ids whatever the size); the rest,
    up to ``min(vocab_size, MAX_TOKENIZER_VOCAB)``, are :func:`synthetic_word` fillers. The fillers
    matter for ``vllm bench serve --dataset-name random``: it builds each prompt as a run of
    consecutive allowed token ids from a random offset, wrapped around the vocabulary, so with
    only ~130 tokens half of 256 prompts repeat an earlier one and the prefix cache serves them;
    with the model's vocabulary the prompts are distinct.
    """
    vocab: dict[str, int] = {}
    for token in _SPECIALS + _WORDS + _CHARS:
        vocab.setdefault(token, len(vocab))
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(vocab)} tokens; "
                         f"give the model a vocab_size of at least {len(vocab)}")
    for token_id in range(len(vocab), min(vocab_size, MAX_TOKENIZER_VOCAB)):
        vocab[synthetic_word(token_id)] = token_id
    return vocab


def _write_tokenizer(out: Path, vocab_size: int, max_len: int) -> bool:
    """Write a word-level tokenizer of :func:`tokenizer_vocab` (``vocab_size`` tokens, at most
    :data:`MAX_TOKENIZER_VOCAB`); returns False when ``tokenizers`` is not installed."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    except ImportError:
        return False
    vocab = tokenizer_vocab(vocab_size)
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


def _decoder_fields(cfg: dict) -> dict:
    """The decoder's fields with class defaults filled (Gemma 3 omits ``vocab_size``); the raw
    fields for an architecture servebook does not read."""
    from servebook.errors import ConfigError
    from servebook.hf_config import decoder_config

    try:
        return decoder_config(cfg)
    except ConfigError:
        return dict(cfg.get("text_config", cfg))


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
        text_cfg = _decoder_fields(cfg)
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
