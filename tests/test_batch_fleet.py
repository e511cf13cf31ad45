"""The fleet path (Ray Data + vLLM) without Ray: row conversions, vLLM's finish reason, Ray's
output streamed into the result store once per id, shards read together; the HTTP engine's
request/response mapping; lab L8's workload."""
import json

import pytest

from servebook.batch import ray_data
from servebook.batch.http_engine import completion_body, record_from_completion
from servebook.batch.requests import BatchRequest, parse_request_lines
from servebook.lab.analyses.lab8_batch_tactics import PROFILES, tactic_requests
from servebook.errors import ServebookError


def test_ray_rows_carry_id_prompt_and_sampling():
    text = BatchRequest(id="a", line=1, max_tokens=5, prompt="hi", sampling={"temperature": 0})
    ids = BatchRequest(id="b", line=2, max_tokens=3, prompt_token_ids=(4, 5))
    assert ray_data.ray_row(text) == {"id": "a", "prompt": "hi", "sampling_params": {"max_tokens": 5, "temperature": 0}}
    assert ray_data.ray_row(ids) == {"id": "b", "prompt": "", "tokenized_prompt": [4, 5],
                                     "sampling_params": {"max_tokens": 3}}
    cols = ray_data.output_columns({"id": "b", "generated_tokens": [7, 8], "generated_text": "x y",
                                    "num_input_tokens": 2, "extra": 1})
    out = ray_data.result_record(cols, ids, max_model_len=64)
    # Same keys in the same order as the single-engine record (vllm_engine.result_record).
    assert list(out) == ["id", "prompt_tokens", "token_ids", "text", "finish_reason"]
    assert out == {"id": "b", "prompt_tokens": 2, "token_ids": [7, 8], "text": "x y", "finish_reason": "stop"}


@pytest.mark.parametrize("sampling, tokens, prompt, eos, want", [
    ({}, [5, 6, 7], 4, None, "length"),                          # max_tokens=3 reached
    ({}, [5, 6], 4, None, "stop"),                               # ended early: a stop condition
    ({}, [5, 6, 2], 4, 2, "stop"),                               # EOS is checked before length
    ({"ignore_eos": True}, [5, 6, 2], 4, 2, "length"),           # unless ignore_eos
    ({"stop_token_ids": [7]}, [5, 6, 7], 4, None, "stop"),       # a stop token, also before length
    ({}, [5, 6], 8, None, "length"),                             # 8 + 2 = max_model_len 10
])
def test_finish_reason_follows_vllm_check_stop(sampling, tokens, prompt, eos, want):
    req = BatchRequest(id="r", line=1, max_tokens=3, prompt_token_ids=(1,), sampling=sampling)
    assert ray_data.finish_reason(req, tokens, prompt, max_model_len=10, eos_token_id=eos) == want


def test_stream_appends_once_per_id_and_counts_repeats(tmp_path):
    from servebook.batch.store import ResultStore, read_results

    class Bar:
        updates = []

        def update(self, requests, tokens):
            self.updates.append((requests, tokens))

    rec = lambda i, n: {"id": i, "token_ids": list(range(n))}  # noqa: E731
    with ResultStore(tmp_path / "out.jsonl") as store:
        store.append([rec("done", 1)])
        got = ray_data._stream_into(store, iter([rec("a", 2), rec("done", 1), rec("b", 3), rec("a", 2),
                                                 rec("c", 1)]), 2, Bar())
    assert got == (3, 2, 6)                                     # a, b, c written; done and a again dropped
    assert Bar.updates == [(2, 5), (1, 1)]                      # flushed every 2 records, then the rest
    assert list(read_results(tmp_path / "out.jsonl")) == ["done", "a", "b", "c"]


def test_shards_are_read_together_and_may_not_share_ids(tmp_path):
    one, two = tmp_path / "s0.jsonl", tmp_path / "s1.jsonl"
    one.write_text('{"id": "a", "prompt": "x", "max_tokens": 1}\n{"id": "b", "prompt": "x", "max_tokens": 1}\n')
    two.write_text('{"id": "c", "prompt": "x", "max_tokens": 1}\n{"id": "a", "prompt": "y", "max_tokens": 1}\n')
    requests, problems, report = ray_data.read_inputs([one, two])
    assert [r.id for r in requests] == ["a", "b", "c"]
    assert report == [f"{two}:2: id also in {one}; shards must not share ids"]
    assert [(p.line, p.id) for p in problems] == [(2, "a")]


def test_run_on_ray_reports_bad_lines_before_needing_ray(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "prompt": "x", "max_tokens": 1}\n{"prompt": "x"}\n'
                   '{"id": "a", "prompt_token_ids": [1], "max_tokens": 1}\n')
    with pytest.raises(ServebookError) as err:
        ray_data.run_on_ray(src, tmp_path / "out.jsonl", model="m")
    text = str(err.value)
    assert text.startswith("2 of 3 input lines cannot run; no engine was started. Fix them, or pass "
                           f"skip_invalid=True to run the rest (the bad lines then go to {tmp_path}/out.jsonl.rejected.jsonl)")
    assert f"{src}:2: missing \"id\"" in text and f"{src}:3: duplicate id, first used on line 1" in text
    assert not (tmp_path / "out.jsonl").exists()


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
    with pytest.raises(ServebookError, match=r"ray\[data\]==2.60.0"):
        ray_data.run_on_ray(src, tmp_path / "out.jsonl", model="m")


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
