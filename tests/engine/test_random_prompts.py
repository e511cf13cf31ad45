"""``vllm bench serve --dataset-name random`` gives distinct prompts on the labs' model directories.

The GPU labs serve random weights from a directory written by ``servebook.tiny_model.write_model_dir``
and load it with ``vllm bench serve --dataset-name random``. vLLM 0.27.1's ``RandomDataset`` builds
prompt ``i`` as the allowed token ids ``(offset_i + i + 0, 1, 2, ...) mod len(allowed)`` from a random
offset, decoded to text and encoded back. With the ~130-token tokenizer the directory used to hold,
about half of 256 prompts repeated an earlier one, and vLLM's prefix cache (on by default) served
35-75% of the prompt tokens of the recorded GPU runs. Here vLLM's own ``RandomDataset.sample`` runs
on the directory's tokenizer (random_prompts_probe.py, in the shared vLLM probe; no engine starts,
a few seconds per model) and the prompts, encoded as the server encodes them, are cut into KV blocks
the way the prefix cache looks them up.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.vllm_env]   # vLLM's Python, no engine start

HERE = Path(__file__).resolve().parent
MODELS = HERE.parents[1] / "src" / "servebook" / "data" / "models"
PROBE = HERE / "random_prompts_probe.py"
BLOCK = 16                   # tokens per KV block: vLLM's default on CUDA, where the labs measure
NUM_PROMPTS, INPUT_LEN, SEED = 256, 512, 0     # Lab 9's saturation load on the GPU profile
ROLE_MARKERS = {3, 4, 5}     # <|user|> <|assistant|> <|system|>: the Punctuation pre-tokenizer splits them


def shared_leading_blocks(prompts: list[list[int]], block: int) -> list[int]:
    """For each prompt, how many of its leading full blocks an earlier prompt already holds.

    That is what an unbounded prefix cache would serve: block ``k`` of a prompt is a hit only when
    the prompt's first ``(k + 1) * block`` tokens equal an earlier prompt's, and the first miss ends
    the lookup.
    """
    seen: set[tuple[int, ...]] = set()
    out = []
    for ids in prompts:
        full = len(ids) // block
        hits = 0
        while hits < full and tuple(ids[:(hits + 1) * block]) in seen:
            hits += 1
        out.append(hits)
        seen.update(tuple(ids[:(k + 1) * block]) for k in range(full))
    return out


def test_shared_leading_blocks_follows_the_prefix_rule():
    a = [1, 2, 3, 4, 5, 6]
    assert shared_leading_blocks([a, a], 2) == [0, 3]                      # a repeat: every block
    assert shared_leading_blocks([a, [1, 2, 3, 9, 5, 6]], 2) == [0, 1]     # the first miss ends it
    assert shared_leading_blocks([a, [9, 2, 3, 4, 5, 6]], 2) == [0, 0]     # same blocks, new prefix
    assert shared_leading_blocks([a, [1, 2, 3]], 2) == [0, 1]              # partial block not counted
    assert shared_leading_blocks([[7] * 4, [7] * 4, [7] * 6], 2) == [0, 2, 2]


@pytest.fixture(scope="module", params=["llama-3.1-8b", "qwen3-32b"])
def probe(request, vllm_probe, tmp_path_factory):
    """The probe's answer for one reference config (Labs 1-4 default to Llama 3.1 8B, Lab 9 Qwen3)."""
    config = MODELS / f"{request.param}.json"
    work = tmp_path_factory.mktemp(f"random-{request.param}")
    out = vllm_probe.run(PROBE, config, work, NUM_PROMPTS, INPUT_LEN, SEED, timeout_s=300)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads((work / "probe.json").read_text())
    doc["model_vocab_size"] = json.loads(config.read_text())["vocab_size"]
    return doc


def test_tokenizer_has_the_models_vocabulary(probe):
    assert probe["vocab_size"] == probe["model_vocab_size"]
    assert probe["special_ids"] == [0, 1, 2]            # <unk> <s> </s>: RandomDataset leaves them out


def test_each_prompt_has_the_requested_length(probe):
    # RandomDataset leaves room for the BOS the server adds (num_special_tokens_to_add)
    assert probe["num_special_tokens_to_add"] == 1
    assert probe["prompt_lens"] == [INPUT_LEN - 1] * NUM_PROMPTS
    assert [len(ids) for ids in probe["server_ids"]] == [INPUT_LEN] * NUM_PROMPTS
    assert all(ids[0] == 1 for ids in probe["server_ids"])   # BOS


def test_random_prompts_share_almost_no_leading_block(probe):
    """Every prompt starts with BOS and then a run from its own random offset; two runs share a block
    only when they start at the same id. Among 256 offsets over ~130k allowed ids that happens to a
    pair with probability about 256 * 255 / 2 / 130k (0.2-0.25), so at most two repeated prompts are
    allowed. With the old 131-token tokenizer 4,576 of these 8,192 blocks (56%) were shared."""
    hits = shared_leading_blocks(probe["server_ids"], BLOCK)
    blocks = NUM_PROMPTS * (INPUT_LEN // BLOCK)
    assert sum(hits) <= 2 * (INPUT_LEN // BLOCK), f"{sum(hits)} of {blocks} blocks shared"
    assert sum(h > 0 for h in hits) <= 2


def test_every_token_round_trips_through_decode_and_encode(probe):
    # ids 0-2 are special (RandomDataset never draws them); the chat-role markers are split by the
    # Punctuation pre-tokenizer, as they always were; every other id must come back as itself,
    # alone and inside runs of consecutive ids (how RandomDataset decodes a prompt).
    assert set(probe["roundtrip_bad_single"]) <= ROLE_MARKERS
    assert probe["roundtrip_bad_runs"] == []


def test_prompt_starts_match_vllms_random_dataset(probe):
    """servebook.lab.harness.random_prompts repeats vLLM's draws without vLLM (the unit tests use it to show that
    Lab 9's benchmark clients, one seed each, send no prompt twice): the first token after BOS of each
    prompt vLLM built must be the allowed id at the predicted start (allowed ids: every id but 0-2)."""
    from servebook.lab.harness.random_prompts import prompt_starts

    starts = prompt_starts(SEED, NUM_PROMPTS, vocab_size=probe["vocab_size"],
                           num_special_ids=len(probe["special_ids"]), input_len=INPUT_LEN, output_len=1,
                           num_special_tokens_to_add=probe["num_special_tokens_to_add"])
    firsts = [ids[1] for ids in probe["server_ids"]]
    checked = [(s + 3, f) for s, f in zip(starts, firsts) if s + 3 not in ROLE_MARKERS]
    assert len(checked) >= NUM_PROMPTS - 3
    assert [f for _, f in checked] == [s for s, _ in checked]
