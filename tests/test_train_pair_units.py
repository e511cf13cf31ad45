"""Units of Lab 7's helpers that need no engine and no torch: sizes, configs, corpus, counters."""
from __future__ import annotations

import copy

import pytest

from servebook.errors import ServebookError
from servebook.hf_config import load_model_spec
from servebook.lab.harness.profiles import LAB_PARAMS
from servebook.lab.analyses.lab7_speculative import acceptance_summary, summed_counters, tokens_per_sequence_step
from servebook.lab.analyses.lab7_train_pair import check_sizes, corpus_files, llama_config, parameter_count, read_text

TINY = {"hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "intermediate_size": 8}


def test_parameter_count_by_hand():
    # head_dim 2, KV width 1 x 2 = 2. q 4x4 + o 4x4 = 32; k, v 4x2 each = 16; MLP 3 x 4x8 = 96;
    # two norms 2 x 4 = 8 -> 152 per layer. Embedding 10x4 + untied head 10x4 + final norm 4 = 84.
    assert parameter_count(TINY, vocab_size=10) == 152 + 84


@pytest.mark.parametrize("profile", ["cpu-smoke", "gpu"])
def test_profile_sizes_are_valid_and_agree_with_the_config_reader(profile):
    sizes = LAB_PARAMS[profile]["l7"]["train"]
    assert check_sizes(sizes) is sizes
    for role in ("target", "draft"):
        cfg = llama_config(sizes[role], vocab_size=sizes["vocab_size"], max_position_embeddings=2048, dtype="bfloat16")
        # servebook.hf_config reads the same config.json independently, tensor by tensor.
        assert load_model_spec(cfg, name=role).params.total == parameter_count(sizes[role], sizes["vocab_size"])
    assert parameter_count(sizes["draft"], sizes["vocab_size"]) < parameter_count(sizes["target"], sizes["vocab_size"])


def test_llama_config_shapes():
    cfg = llama_config(TINY, vocab_size=300, max_position_embeddings=128, dtype="float32")
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["head_dim"] == 2
    assert cfg["vocab_size"] == 300 and cfg["torch_dtype"] == "float32" and cfg["tie_word_embeddings"] is False


def _sizes():
    return copy.deepcopy(LAB_PARAMS["cpu-smoke"]["l7"]["train"])


@pytest.mark.parametrize("change, words", [
    (lambda s: s.pop("steps"), "lack steps"),
    (lambda s: s.update(vocab_size=100), "vocab_size=100"),
    (lambda s: s.update(lr=2.0), "learning rate"),
    (lambda s: s.update(batch_size=0), "batch_size=0"),
    (lambda s: s["target"].update(num_attention_heads=3), "not a multiple of num_attention_heads"),
    (lambda s: s["draft"].update(num_key_value_heads=2, num_attention_heads=3, hidden_size=63), "not a multiple"),
    (lambda s: s.update(draft=dict(s["target"])), "draft must be smaller"),
])
def test_bad_sizes_say_what_to_change(change, words):
    s = _sizes()
    change(s)
    with pytest.raises(ServebookError, match=words):
        check_sizes(s)


def test_corpus_is_sorted_bounded_and_holds_out_later_files(tmp_path):
    for name, n in [("d.py", 50), ("a.py", 40), ("c.py", 30), ("b.py", 20), ("e.py", 10), ("f.txt", 99)]:
        (tmp_path / name).write_text("x" * n)
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "aa.py").write_text("y" * 10)
    train, held = corpus_files(55, root=tmp_path, holdout_files=2)
    # Sorted by name; a (40) then b (20) reach 55 bytes; the next two files are held out.
    assert [p.name for p in train] == ["a.py", "b.py"]
    assert [p.name for p in held] == ["c.py", "d.py"]
    train_r, _ = corpus_files(10**6, root=tmp_path, holdout_files=1, recursive=True)
    assert "aa.py" not in [p.name for p in train_r]          # test folders are skipped
    assert read_text(train, 45) == "x" * 40 + "\n\n" + "xxx"
    with pytest.raises(ServebookError, match="more than 9"):
        corpus_files(10, root=tmp_path, holdout_files=9)


def test_acceptance_summary_by_hand():
    s = acceptance_summary(15, 45, 16, [13, 2, 1])
    assert s["acceptance_rate"] == pytest.approx(16 / 45)
    assert s["mean_acceptance_length"] == pytest.approx(1 + 16 / 15)
    assert s["first_position_acceptance"] == pytest.approx(13 / 15)
    empty = acceptance_summary(0, 0, 0, [])
    assert empty["acceptance_rate"] is None and empty["mean_acceptance_length"] is None
    with pytest.raises(ServebookError, match="exceed"):
        acceptance_summary(1, 3, 4)
    with pytest.raises(ServebookError, match="deltas"):
        acceptance_summary(-1, 3, 1)


def test_tokens_per_sequence_step():
    # 32 tokens of which 16 were accepted drafts: 16 steps, 2 tokens each.
    assert tokens_per_sequence_step(32, 16) == 2.0
    assert tokens_per_sequence_step(32, 0) == 1.0
    with pytest.raises(ServebookError):
        tokens_per_sequence_step(32, 32)
    # A draft model: 2 requests of 32 tokens, 20 drafted steps + 2 prefill steps -> 64 / 22 tokens per step,
    # whatever the accepted counter says (it may include drafts cut off by max_tokens).
    assert tokens_per_sequence_step(64, 50, drafts=20, requests=2) == pytest.approx(64 / 22)
    with pytest.raises(ServebookError):
        tokens_per_sequence_step(64, 0, drafts=20, requests=0)


def test_summed_counters_adds_positions_of_unequal_length():
    points = [{"output_tokens": 32, "counters": {"drafts": 2, "draft_tokens": 6, "accepted_tokens": 3,
                                                  "accepted_per_position": [2, 1]}},
              {"output_tokens": 64, "counters": {"drafts": 5, "draft_tokens": 15, "accepted_tokens": 6,
                                                  "accepted_per_position": [4, 1, 1]}}]
    assert summed_counters(points) == {"drafts": 7, "draft_tokens": 21, "accepted_tokens": 9,
                                       "accepted_per_position": [6, 2, 1], "output_tokens": 96}
