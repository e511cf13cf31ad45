"""The fleet path (Ray Data + vLLM) without Ray: row conversions, attempts, at-least-once outputs
collected into exactly-once; the HTTP engine's request/response mapping; lab L8's workload."""
import json

import pytest

from servebook.batch import ray_data
from servebook.batch.http_engine import completion_body, record_from_completion
from servebook.batch.requests import BatchRequest, parse_request_lines
from servebook.batch.tactics import PROFILES, tactic_requests
from servebook.errors import ServebookError


def test_ray_rows_carry_id_prompt_and_sampling():
    text = BatchRequest(id="a", line=1, max_tokens=5, prompt="hi", sampling={"temperature": 0})
    ids = BatchRequest(id="b", line=2, max_tokens=3, prompt_token_ids=(4, 5))
    assert ray_data.ray_row(text) == {"id": "a", "prompt": "hi", "sampling_params": {"max_tokens": 5, "temperature": 0}}
    assert ray_data.ray_row(ids) == {"id": "b", "prompt": "", "tokenized_prompt": [4, 5],
                                     "sampling_params": {"max_tokens": 3}}
    out = ray_data.record_from_ray_row({"id": "b", "generated_tokens": [7, 8], "generated_text": "x y",
                                        "num_input_tokens": 2, "extra": 1})
    assert out == {"id": "b", "prompt_tokens": 2, "token_ids": [7, 8], "text": "x y", "finish_reason": None}


def test_attempt_folders_number_in_order(tmp_path):
    assert ray_data.next_attempt_dir(tmp_path).name == "attempt-0000"
    (tmp_path / "attempt-0000").mkdir()
    (tmp_path / "attempt-0001").mkdir()
    (tmp_path / "notes").mkdir()
    assert [p.name for p in ray_data.attempt_dirs(tmp_path)] == ["attempt-0000", "attempt-0001"]
    assert ray_data.next_attempt_dir(tmp_path).name == "attempt-0002"


def test_collect_keeps_one_record_per_id_and_skips_torn_lines(tmp_path):
    a0, a1 = tmp_path / "attempt-0000", tmp_path / "attempt-0001"
    a0.mkdir(), a1.mkdir()
    rec = lambda i, t: json.dumps({"id": i, "token_ids": t})  # noqa: E731
    (a0 / "block-1.json").write_text(rec("x", [1]) + "\n" + rec("y", [2]) + "\n")
    (a0 / "block-2.json").write_text(rec("z", [3]) + "\n" + '{"id": "w", "tok')     # killed mid-write
    (a1 / "block-1.json").write_text(rec("y", [2]) + "\n" + rec("w", [4]) + "\n")   # retried y, then w
    got = ray_data.collect_ray_outputs(tmp_path)
    assert {k: v["token_ids"] for k, v in got.records.items()} == {"x": [1], "y": [2], "z": [3], "w": [4]}
    assert (got.duplicate_lines, got.torn_lines) == (1, 1)
    reqs, _ = parse_request_lines([json.dumps({"id": i, "prompt": "p", "max_tokens": 1}) for i in "xyzwv"])
    assert [r["id"] for r in ray_data.pending_rows(reqs, got.records)] == ["v"]


def test_run_on_ray_reports_bad_lines_before_needing_ray(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "prompt": "x", "max_tokens": 1}\n{"prompt": "x"}\n'
                   '{"id": "a", "prompt_token_ids": [1], "max_tokens": 1}\n')
    with pytest.raises(ServebookError) as err:
        ray_data.run_on_ray(src, tmp_path / "out", model="m")
    assert "2 input lines" in str(err.value) and "line 2" in str(err.value) and "line 3 (id 'a')" in str(err.value)


def test_run_on_ray_without_ray_says_what_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "prompt": "x", "max_tokens": 1}\n')
    with pytest.raises(ServebookError, match=r"ray\[data,llm\]"):
        ray_data.run_on_ray(src, tmp_path / "out", model="m")


def test_http_completion_body_and_record():
    req = BatchRequest(id="q", line=1, max_tokens=7, prompt_token_ids=(3, 4), sampling={"temperature": 0.0})
    assert completion_body("m", req, [3, 4]) == {"model": "m", "prompt": [3, 4], "max_tokens": 7,
                                                 "return_token_ids": True, "stream": False, "temperature": 0.0}
    resp = {"choices": [{"text": "ab", "token_ids": [9, 8], "finish_reason": "length"}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 2}}
    assert record_from_completion("q", resp) == {"id": "q", "prompt_tokens": 2, "token_ids": [9, 8], "text": "ab",
                                                 "finish_reason": "length"}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_lab_l8_tight_and_loose_do_the_same_work(name):
    profile = PROFILES[name]
    tight, loose = tactic_requests(profile, loose=False), tactic_requests(profile, loose=True)
    lo, hi = profile.workload.output_tokens
    assert len(tight) == len(loose) == profile.workload.num_requests
    for t, l in zip(tight, loose):
        true_len = t.sampling["min_tokens"]
        assert lo <= true_len <= hi
        assert t.max_tokens == true_len + 1 and l.max_tokens == profile.loose_max_tokens
        assert t.sampling == l.sampling and t.prompt_token_ids == l.prompt_token_ids
        allowed, stops = set(t.sampling["allowed_token_ids"]), set(t.sampling["stop_token_ids"])
        assert stops < allowed and len(allowed - stops) == profile.keep_going
        assert len(t.prompt_token_ids) < profile.max_model_len
        assert max(t.prompt_token_ids) < profile.workload.vocab_size
        assert max(allowed) < 100   # inside the test tokenizer at any vocab_size (servebook.tiny_model)
    # Shared prefixes must span at least one KV block, or prefix caching cannot reuse them.
    assert profile.workload.prefix_tokens >= profile.block_tokens
