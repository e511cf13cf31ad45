"""The vocabulary of the test tokenizer (``servebook.tiny_model.tokenizer_vocab``); no engine, no ``tokenizers``.

tests/engine/test_random_prompts.py checks the written tokenizer itself inside vLLM's Python.
"""
from __future__ import annotations

import re

import pytest

from servebook.tiny_model import (MAX_TOKENIZER_VOCAB, TINY_LLAMA_CONFIG, synthetic_word, tokenizer_vocab,
                                  write_model_dir)


def _base_size() -> int:
    """The number of named tokens: the smallest vocabulary that raises nothing."""
    for size in range(1, 1000):
        try:
            tokenizer_vocab(size)
            return size
        except ValueError:
            continue
    raise AssertionError("no size up to 1000 is accepted")


def test_vocabulary_fills_the_models_size_with_distinct_ids():
    vocab = tokenizer_vocab(151_936)
    assert len(vocab) == 151_936
    assert sorted(vocab.values()) == list(range(151_936))


def test_named_tokens_keep_their_ids_whatever_the_size():
    base = _base_size()
    small = tokenizer_vocab(base)
    assert 100 < base < 200   # specials, a few words, single characters
    for size in (512, 128_256, 151_936):
        big = tokenizer_vocab(size)
        assert {t: i for t, i in big.items() if i < base} == small
    # the engine's BOS/EOS ids (config.json) are the tokenizer's <s> and </s>
    assert small["<s>"] == TINY_LLAMA_CONFIG["bos_token_id"] and small["</s>"] == TINY_LLAMA_CONFIG["eos_token_id"]
    assert small["<unk>"] == 0


def test_fillers_are_single_words_that_the_pre_tokenizer_keeps_whole():
    base = _base_size()
    vocab = tokenizer_vocab(base + 5000)
    fillers = [t for t, i in vocab.items() if i >= base]
    assert len(fillers) == 5000
    # WhitespaceSplit + Punctuation split only at spaces and punctuation: letters and digits stay one piece
    assert all(re.fullmatch(r"[A-Za-z0-9]+", t) for t in fillers)
    assert not any(t.startswith("##") for t in fillers)   # the WordPiece decoder's continuation prefix
    assert vocab[synthetic_word(base + 17)] == base + 17


def test_vocabulary_is_capped():
    assert len(tokenizer_vocab(MAX_TOKENIZER_VOCAB + 64)) == MAX_TOKENIZER_VOCAB == 262_144


def test_too_small_a_vocabulary_says_what_to_change():
    base = _base_size()
    with pytest.raises(ValueError, match=f"vocab_size of at least {base}"):
        tokenizer_vocab(base - 1)


def test_config_only_directory(tmp_path):
    out = write_model_dir(tmp_path / "m", tokenizer=False)
    assert (out / "config.json").exists() and not (out / "tokenizer.json").exists()


def test_tokenizer_size_comes_from_the_decoder_config_with_class_defaults():
    # google/gemma-3-27b-it's text_config omits vocab_size; transformers' Gemma3TextConfig default
    # is 262,208, so the written tokenizer must not fall back to the tiny model's 512
    from servebook.hf_config import load_reference_config
    from servebook.tiny_model import _decoder_fields, language_model_config

    gemma3 = language_model_config(load_reference_config("gemma-3-27b"))
    assert "vocab_size" not in gemma3
    assert _decoder_fields(gemma3)["vocab_size"] == 262_208
    assert _decoder_fields(load_reference_config("qwen3-32b"))["vocab_size"] == 151_936
    unknown = {"architectures": ["NoSuchForCausalLM"], "vocab_size": 1000}
    assert _decoder_fields(unknown)["vocab_size"] == 1000          # raw fields for what servebook cannot read
