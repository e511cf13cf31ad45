"""Lab 7 (speculative decoding) runs top to bottom in ``cpu-smoke``, with real trained weights.

The lab trains a tiny target/draft pair, then serves n-gram, draft-model (two k), untrained-draft
and per-batch-size-schedule engines beside a baseline. The assertions read the raw data the lab
recorded (the engines' own counters and token ids), not the figures the lab computed from them:

* speculation does not change greedy text: every output equals the baseline's, token for token;
* every request made exactly ``max_tokens`` tokens (``ignore_eos``);
* vLLM's counters obey their definitions: accepted <= drafted, the per-position counts sum to the
  accepted count and never rise with the position (draft j+1 is accepted only after draft j);
* a draft model drafts at every decode step (steps, drafts and tokens add up, up to the drafts
  ``max_tokens`` cuts off), and exactly ``k`` tokens each time when one request runs (batch 1); the
  schedule engine drafts the schedule's batch-1 ``k`` at batch 1 and fewer at the larger batch;
* the trained draft's acceptance is far above an untrained draft's of the same shape.
"""
from __future__ import annotations

import pytest

pytest.importorskip("jupytext")
pytest.importorskip("nbclient")

from labrun import LABS, check_provenance, run_lab  # noqa: E402

from servebook.lab.harness.profiles import LAB_PARAMS  # noqa: E402

pytestmark = pytest.mark.engine
W = LAB_PARAMS["cpu-smoke"]["l7"]


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    return run_lab(LABS / "l7_speculative.md", tmp_path_factory.mktemp("l7"), timeout_s=600)


def _engines(doc):
    return doc["measurements"]["engines"]


def test_provenance_and_real_weights(doc):
    check_provenance(doc)
    assert doc["weights"] == "real"
    assert "load_format" not in doc["engine_args"]
    pair = doc["measurements"]["pair"]
    # Training lowered both losses below uniform guessing over the vocabulary (ln V nats).
    import math
    for role in ("target", "draft"):
        assert pair["final_loss"][role] < pair["first_loss"][role]
        assert pair["final_loss"][role] < math.log(pair["vocab_size"]) - 1.0


def test_every_engine_started(doc):
    engines = _engines(doc)
    expected = {"baseline", *(f"ngram k={k}" for k in W["ngram_ks"]), *(f"draft k={k}" for k in W["ks"]),
                f"untrained draft k={max(W['ks'])}", "draft schedule"}
    assert set(engines) == expected
    failed = {n: e["error"] for n, e in engines.items() if not e["ok"]}
    assert not failed, failed


def test_greedy_text_unchanged_and_lengths_exact(doc):
    engines = _engines(doc)
    base = engines["baseline"]["outputs"]
    for b, outs in zip(W["batch_sizes"], base):
        assert len(outs) == b and all(len(o) == W["max_tokens"] for o in outs)
    for name, e in engines.items():
        assert e["outputs"] == base, f"{name} changed greedy text"


def test_counters_obey_their_definitions(doc):
    for name, e in _engines(doc).items():
        for p in e["points"]:
            c = p["counters"]
            if name == "baseline":
                assert c["drafts"] == c["draft_tokens"] == c["accepted_tokens"] == 0
                continue
            assert c["drafts"] > 0, name
            assert 0 <= c["accepted_tokens"] <= c["draft_tokens"], name
            per = c["accepted_per_position"]
            assert sum(per) == c["accepted_tokens"], name
            assert all(per[i] >= per[i + 1] for i in range(len(per) - 1)), (name, per)
            assert per[0] <= c["drafts"]
            # Each step gives a sequence one token of the target's plus its accepted drafts.
            assert p["output_tokens"] == p["batch"] * W["max_tokens"]
            assert c["accepted_tokens"] < p["output_tokens"]


def test_a_draft_model_drafts_at_every_decode_step(doc):
    # Steps per request = 1 prefill step + one per draft, each giving 1 token + the accepted drafts; the
    # last step's accepted drafts may be cut off by max_tokens (at most k per request).
    engines = _engines(doc)
    names = [f"draft k={k}" for k in W["ks"]] + [f"untrained draft k={max(W['ks'])}", "draft schedule"]
    for name in names:
        k = max(W["ks"]) if not name.startswith("draft k=") else int(name.split("=")[1])
        for p in engines[name]["points"]:
            c = p["counters"]
            cut_off = c["drafts"] + p["batch"] + c["accepted_tokens"] - p["output_tokens"]
            assert 0 <= cut_off <= k * p["batch"], (name, p["batch"], cut_off)


def test_draft_model_drafts_k_per_step_and_schedule_switches_k(doc):
    engines = _engines(doc)
    batch1 = W["batch_sizes"].index(1)
    for k in W["ks"]:
        c = engines[f"draft k={k}"]["points"][batch1]["counters"]
        assert c["draft_tokens"] == k * c["drafts"]
    # The schedule's first range covers batch 1; the next covers the larger batch with a smaller k.
    (start, end, k_small_batch), (start2, end2, k_large_batch) = W["schedule"]
    assert start == end == 1 and start2 <= max(W["batch_sizes"]) <= end2 and k_large_batch < k_small_batch
    pts = engines["draft schedule"]["points"]
    c1 = pts[batch1]["counters"]
    assert c1["draft_tokens"] == k_small_batch * c1["drafts"]
    big = pts[W["batch_sizes"].index(max(W["batch_sizes"]))]["counters"]
    assert big["draft_tokens"] < k_small_batch * big["drafts"]
    assert big["draft_tokens"] >= k_large_batch * big["drafts"]


def test_trained_draft_beats_untrained_one(doc):
    engines = _engines(doc)
    k = max(W["ks"])

    def rate(name):
        tot = [sum(p["counters"][key] for p in engines[name]["points"]) for key in ("accepted_tokens", "draft_tokens")]
        return tot[0] / tot[1]

    trained, untrained = rate(f"draft k={k}"), rate(f"untrained draft k={k}")
    print(f"\nacceptance at k={k}: trained draft {trained:.3f}, untrained {untrained:.3f} "
          f"(chance {1 / W['train']['vocab_size']:.4f})")
    assert trained > 0.15
    assert untrained < 0.05
    assert trained > 5 * untrained
