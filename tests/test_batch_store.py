"""Durable results: torn-tail repair, duplicates refused, lock, and the fsync'd append."""
import json
import os

import pytest

from servebook.batch.store import ResultStore, read_results, repair_torn_tail
from servebook.cli import main
from servebook.errors import ServebookError

REC_A = b'{"id":"a","token_ids":[1,2]}\n'
REC_B = b'{"id":"b","token_ids":[3]}\n'


def test_whole_file_is_left_alone(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(REC_A + REC_B)
    report = repair_torn_tail(out)
    assert (report.removed_bytes, report.kept_records, report.torn_copy) == (0, 2, None)
    assert out.read_bytes() == REC_A + REC_B


@pytest.mark.parametrize("cut", [1, 5, len(REC_B) - 1])   # a write of record b cut after `cut` bytes
def test_torn_last_record_is_cut_and_kept_aside(tmp_path, cut):
    out = tmp_path / "out.jsonl"
    out.write_bytes(REC_A + REC_B[:cut])
    report = repair_torn_tail(out)
    assert report.removed_bytes == cut
    assert out.read_bytes() == REC_A
    assert (tmp_path / "out.jsonl.torn").read_bytes() == REC_B[:cut]
    assert list(read_results(out)) == ["a"]


def test_record_without_its_newline_does_not_count(tmp_path):
    # Complete JSON but no newline: the write was cut just before "\n"; the request runs again.
    out = tmp_path / "out.jsonl"
    out.write_bytes(REC_A + REC_B[:-1])
    assert repair_torn_tail(out).removed_bytes == len(REC_B) - 1
    assert out.read_bytes() == REC_A


def test_garbage_last_line_with_newline_is_cut(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(REC_A + b"\x00\x00\x00\n")
    assert repair_torn_tail(out).removed_bytes == 4
    assert out.read_bytes() == REC_A


def test_damage_before_the_last_line_is_an_error_not_a_guess(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(REC_A + b'{"id": "x", broken\n' + REC_B)
    with pytest.raises(ServebookError, match="line 2 .*not the last line"):
        repair_torn_tail(out)
    with pytest.raises(ServebookError, match="line 2"):
        read_results(out)


def test_duplicate_id_in_output_is_refused(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(REC_A + REC_B + REC_A)
    with pytest.raises(ServebookError, match="two results"):
        read_results(out)


def test_store_repairs_on_open_appends_and_refuses_done_ids(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(REC_A + REC_B[:7])
    with ResultStore(out) as store:
        assert store.repair.removed_bytes == 7
        assert set(store.done) == {"a"}
        assert store.append([{"id": "b", "token_ids": [3]}, {"id": "c", "token_ids": []}]) == 2
        with pytest.raises(ServebookError, match="already has a result"):
            store.append([{"id": "a", "token_ids": []}])
        with pytest.raises(ServebookError, match="already has a result"):
            store.append([{"id": "d"}, {"id": "d"}])
    lines = out.read_bytes().splitlines()
    assert [json.loads(l)["id"] for l in lines] == ["a", "b", "c"]


def test_second_store_on_same_output_fails_fast(tmp_path):
    out = tmp_path / "out.jsonl"
    with ResultStore(out):
        with pytest.raises(ServebookError, match="another driver"):
            with ResultStore(out):
                pass
    with ResultStore(out):     # released on exit
        pass


def test_append_calls_fsync(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    with ResultStore(tmp_path / "out.jsonl") as store:
        before = len(calls)
        store.append([{"id": "a"}])
        assert len(calls) == before + 1


def test_repair_cli(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    out.write_bytes(REC_A + b'{"id":')
    assert main(["batch", "repair", str(out)]) == 0
    assert "cut 6 torn bytes after record 1" in capsys.readouterr().out


def test_status_shard_and_merge_cli(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"x{i}", "prompt": "a", "max_tokens": 1}) + "\n" for i in range(6)))
    assert main(["batch", "shard", str(src), "--shards", "2", "--out-dir", str(tmp_path / "s")]) == 0
    shards = sorted((tmp_path / "s").glob("shard-*.jsonl"))
    assert [p.name for p in shards] == ["shard-00000-of-00002.jsonl", "shard-00001-of-00002.jsonl"]
    capsys.readouterr()
    # Each replica's output written by hand: every id of its shard once.
    outs = []
    for k, shard in enumerate(shards):
        out = tmp_path / f"out{k}.jsonl"
        out.write_text("".join(json.dumps({"id": json.loads(l)["id"], "token_ids": [k]}) + "\n"
                               for l in shard.read_text().splitlines()))
        outs.append(out)
    assert main(["batch", "status", str(src), str(outs[0])]) == 0
    status = json.loads(capsys.readouterr().out)
    n0 = len(shards[0].read_text().splitlines())
    assert status == {"requests": 6, "done": n0, "remaining": 6 - n0, "problem_lines": 0}
    merged = tmp_path / "merged.jsonl"
    assert main(["batch", "merge", *map(str, outs), "--input", str(src), "-o", str(merged)]) == 0
    assert [json.loads(l)["id"] for l in merged.read_text().splitlines()] == [f"x{i}" for i in range(6)]
    assert main(["batch", "merge", str(outs[0]), "--input", str(src), "-o", str(merged)]) == 2
    assert "have no result" in capsys.readouterr().err
