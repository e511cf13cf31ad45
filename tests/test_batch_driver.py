"""The resumable driver with a fake engine: crash anywhere, resume, every result exactly once."""
import json
import random

import pytest

from servebook.batch.driver import OrderOptions, plan_chunks, rejected_path, run_batch
from servebook.batch.requests import parse_request_lines
from servebook.batch.shard import merge_results, parse_shard, select_shard, shard_of, write_shards
from servebook.batch.store import read_results
from servebook.errors import ServebookError


class Crash(Exception):
    pass


class FakeEngine:
    """Output = the prompt's last max_tokens tokens reversed; crashes on the call numbered crash_at."""

    def __init__(self, max_model_len=64, crash_at=None):
        self.max_model_len = max_model_len
        self.crash_at = crash_at
        self.calls: list[list[str]] = []

    def prompt_token_ids(self, req):
        if req.prompt_token_ids is not None:
            return list(req.prompt_token_ids)
        return [len(w) for w in req.prompt.split()]      # "tokenizer": word lengths

    def generate(self, requests, token_ids):
        self.calls.append([r.id for r in requests])
        if self.crash_at is not None and len(self.calls) == self.crash_at:
            raise Crash()
        return [{"id": r.id, "token_ids": list(reversed(t))[:r.max_tokens], "text": "", "finish_reason": "length",
                 "prompt_tokens": len(t)} for r, t in zip(requests, token_ids)]


def workload(n=23, seed=1):
    rng = random.Random(seed)
    rows = [{"id": f"q{i}", "prompt_token_ids": [rng.randrange(1, 50) for _ in range(rng.randint(1, 12))],
             "max_tokens": rng.randint(1, 5)} for i in range(n)]
    return parse_request_lines([json.dumps(r) for r in rows]), rows


def expected(rows):
    # Hand rule of FakeEngine, applied to the raw rows.
    return {r["id"]: list(reversed(r["prompt_token_ids"]))[:r["max_tokens"]] for r in rows}


def test_uninterrupted_run_writes_each_result_once(tmp_path):
    (reqs, probs), rows = workload()
    out = tmp_path / "out.jsonl"
    summary = run_batch(reqs, probs, out, FakeEngine(), chunk_size=5, progress=False)
    assert (summary.total, summary.ran, summary.chunks_run, summary.already_done) == (23, 23, 5, 0)  # ceil(23/5)=5
    got = {k: v["token_ids"] for k, v in read_results(out).items()}
    assert got == expected(rows)
    again = run_batch(reqs, probs, out, FakeEngine(), chunk_size=5, progress=False)
    assert (again.ran, again.already_done, again.chunks_run) == (0, 23, 0)


@pytest.mark.parametrize("crash_at", [1, 2, 4, 5])
def test_crash_then_resume_runs_only_the_rest(tmp_path, crash_at):
    (reqs, probs), rows = workload()
    out = tmp_path / "out.jsonl"
    first = FakeEngine(crash_at=crash_at)
    with pytest.raises(Crash):
        run_batch(reqs, probs, out, first, chunk_size=5, progress=False)
    written = set(read_results(out))
    assert len(written) == 5 * (crash_at - 1)          # whole chunks before the crash, nothing of the one in flight
    second = FakeEngine()
    summary = run_batch(reqs, probs, out, second, chunk_size=5, progress=False)
    resubmitted = {i for call in second.calls for i in call}
    assert resubmitted.isdisjoint(written)              # nothing done is run again
    assert summary.already_done == len(written) and summary.ran == 23 - len(written)
    assert {k: v["token_ids"] for k, v in read_results(out).items()} == expected(rows)
    # The resumed chunk is the same set of requests as the crashed one (same chunk boundaries).
    assert second.calls[0] == first.calls[-1]


def test_torn_tail_from_a_crash_is_repaired_and_rerun(tmp_path):
    (reqs, probs), rows = workload()
    out = tmp_path / "out.jsonl"
    with pytest.raises(Crash):
        run_batch(reqs, probs, out, FakeEngine(crash_at=3), chunk_size=5, progress=False)
    lines = out.read_bytes().splitlines(keepends=True)
    torn = lines[-1][: len(lines[-1]) // 2]
    out.write_bytes(b"".join(lines[:-1]) + torn)       # the last record's write was cut in half
    summary = run_batch(reqs, probs, out, FakeEngine(), chunk_size=5, progress=False)
    assert summary.repaired_bytes == len(torn)
    assert summary.already_done == 9 and summary.ran == 14
    assert {k: v["token_ids"] for k, v in read_results(out).items()} == expected(rows)


def test_problems_stop_the_run_unless_skipped_then_they_are_written(tmp_path):
    rows = [{"id": "ok", "prompt": "a bb ccc", "max_tokens": 2},
            {"prompt": "x", "max_tokens": 1},
            {"id": "ok", "prompt": "dup", "max_tokens": 1},
            {"id": "long", "prompt_token_ids": list(range(1, 9)), "max_tokens": 1}]
    reqs, probs = parse_request_lines([json.dumps(r) for r in rows])
    out = tmp_path / "out.jsonl"
    with pytest.raises(ServebookError) as err:
        run_batch(reqs, probs, out, FakeEngine(max_model_len=8), progress=False)
    assert "3 input lines cannot run" in str(err.value)
    assert "line 2" in str(err.value) and "line 3" in str(err.value) and "line 4 (id 'long')" in str(err.value)
    assert not out.exists()
    summary = run_batch(reqs, probs, out, FakeEngine(max_model_len=8), skip_invalid=True, progress=False)
    assert summary.ran == 1 and summary.rejected == 3
    assert read_results(out)["ok"]["token_ids"] == [3, 2]   # word lengths 1,2,3 reversed, 2 tokens
    rejected = [json.loads(l) for l in rejected_path(out).read_text().splitlines()]
    assert [r["line"] for r in rejected] == [2, 3, 4]


def test_engine_returning_other_ids_is_caught(tmp_path):
    class Wrong(FakeEngine):
        def generate(self, requests, token_ids):
            return list(reversed(super().generate(requests, token_ids)))
    (reqs, probs), _ = workload(n=4)
    with pytest.raises(ServebookError, match="other requests"):
        run_batch(reqs, probs, tmp_path / "o.jsonl", Wrong(), chunk_size=4, progress=False)


def test_plan_is_deterministic_and_covers_everything():
    (reqs, _), _ = workload(n=40, seed=7)
    toks = [list(r.prompt_token_ids) for r in reqs]
    plan = plan_chunks(reqs, toks, 6)
    assert plan == plan_chunks(list(reqs), [list(t) for t in toks], 6)
    assert sorted(i for c in plan for i in c) == list(range(40))
    flat = [len(toks[i]) for c in plan_chunks(reqs, toks, 6, OrderOptions(group_by_prefix=False)) for i in c]
    assert flat == sorted(flat)


def test_shards_are_disjoint_cover_and_merge(tmp_path):
    (reqs, probs), rows = workload(n=30)
    n = 3
    outs = []
    for i in range(n):
        part = select_shard(reqs, i, n)
        assert all(shard_of(r.id, n) == i for r in part)
        outs.append(tmp_path / f"out{i}.jsonl")
        run_batch(part, [], outs[-1], FakeEngine(), chunk_size=4, progress=False)
    assert sum(len(select_shard(reqs, i, n)) for i in range(n)) == 30
    merged = merge_results(outs, expected_ids=[r.id for r in reqs])
    assert {k: v["token_ids"] for k, v in merged.items()} == expected(rows)
    with pytest.raises(ServebookError, match="both"):
        merge_results([outs[0], outs[0]])
    with pytest.raises(ServebookError, match="no result"):
        merge_results(outs[:2], expected_ids=[r.id for r in reqs])


def test_shard_files_partition_the_input(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"x{i}", "prompt": "a", "max_tokens": 1}) + "\n" for i in range(50))
                   + "not json\n")
    paths = write_shards(src, tmp_path / "shards", 4)
    seen = []
    for i, p in enumerate(paths):
        for line in p.read_text().splitlines():
            if line == "not json":
                assert i == 0
                continue
            rid = json.loads(line)["id"]
            assert shard_of(rid, 4) == i
            seen.append(rid)
    assert sorted(seen) == sorted(f"x{i}" for i in range(50))


def test_shard_spec_parsing():
    assert parse_shard("2/8") == (2, 8)
    for bad in ("8/8", "x/2", "1", "-1/3"):
        with pytest.raises(ServebookError):
            parse_shard(bad)
