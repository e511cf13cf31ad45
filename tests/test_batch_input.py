"""Batch input checks: every bad line is reported with its line number; ordering by hand."""
import json

import pytest

from servebook.batch.ordering import chunks, prefix_groups, shared_prefix_tokens, submission_order
from servebook.batch.requests import check_prompt_lengths, parse_request_lines, read_requests
from servebook.cli import main
from servebook.errors import ServebookError


def lines(*rows):
    return [r if isinstance(r, str) else json.dumps(r) for r in rows]


def test_every_bad_line_is_reported_with_its_line_number():
    text = lines(
        {"id": "a", "prompt": "hello", "max_tokens": 4},                  # 1 ok
        {"prompt": "no id", "max_tokens": 4},                             # 2 missing id
        {"id": "a", "prompt": "again", "max_tokens": 4},                  # 3 duplicate of line 1
        "{not json",                                                      # 4
        "",                                                               # 5 blank: ignored
        {"id": "b", "prompt": "x", "prompt_token_ids": [1], "max_tokens": 1},  # 6 both prompts
        {"id": "c", "prompt_token_ids": [1, -2], "max_tokens": 1},        # 7 negative token
        {"id": "d", "prompt": "x"},                                       # 8 no max_tokens, no default
        {"id": "e", "prompt": "x", "max_tokens": 0},                      # 9
        {"id": "f", "prompt": "x", "max_tokens": 3, "sampling": {"temprature": 0}},  # 10 typo
        {"id": 7, "prompt_token_ids": [5, 6], "max_tokens": 2},           # 11 ok, int id
        ["a", "list"],                                                    # 12
    )
    requests, problems = parse_request_lines(text)
    assert [r.id for r in requests] == ["a", "7"]
    assert [r.line for r in requests] == [1, 11]
    assert [p.line for p in problems] == [2, 3, 4, 6, 7, 8, 9, 10, 12]
    by_line = {p.line: p for p in problems}
    assert "missing \"id\"" in by_line[2].message
    assert "first used on line 1" in by_line[3].message and by_line[3].id == "a"
    assert "temprature" in by_line[10].message
    assert str(by_line[3]).startswith("line 3 (id 'a')")


def test_default_max_tokens_fills_missing_ones_only():
    requests, problems = parse_request_lines(lines({"id": 1, "prompt": "x"}, {"id": 2, "prompt": "y", "max_tokens": 9}),
                                             default_max_tokens=5)
    assert problems == []
    assert [r.max_tokens for r in requests] == [5, 9]


def test_prompt_must_leave_room_for_one_output_token():
    # vLLM 0.27.1 rejects prompt_len >= max_model_len (input_processor._validate_prompt_len).
    requests, _ = parse_request_lines(lines(
        {"id": "fits", "prompt_token_ids": list(range(9)), "max_tokens": 1},     # 9 < 10
        {"id": "equal", "prompt_token_ids": list(range(10)), "max_tokens": 1},   # 10 == 10
        {"id": "over", "prompt_token_ids": list(range(11)), "max_tokens": 1},
    ))
    fits, problems = check_prompt_lengths(requests, lambda r: len(r.prompt_token_ids), max_model_len=10)
    assert [r.id for r in fits] == ["fits"]
    assert [(p.line, p.id) for p in problems] == [(2, "equal"), (3, "over")]
    assert "at most 9" in problems[0].message


def test_read_requests_missing_file_says_what_to_do(tmp_path):
    with pytest.raises(ServebookError, match="does not exist"):
        read_requests(tmp_path / "nope.jsonl")


def test_check_cli_exits_2_and_prints_line_numbers(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines({"id": "a", "prompt": "x", "max_tokens": 1}, {"prompt": "x", "max_tokens": 1})) + "\n")
    assert main(["batch", "check", str(path)]) == 2
    out = capsys.readouterr().out
    assert "1 valid requests, 1 problem lines" in out and "line 2:" in out


def test_shared_prefix_count():
    assert shared_prefix_tokens([1, 2, 3], [1, 2, 4, 5]) == 2
    assert shared_prefix_tokens([], [1]) == 0
    assert shared_prefix_tokens([7, 8], [7, 8]) == 2


def test_prefix_groups_then_length_order_by_hand():
    P, Q = [1] * 4, [2] * 4          # two 4-token "system prompts"
    toks = [Q + [9, 9, 9], P + [5], Q + [3], P + [6, 6, 6, 6], [3, 3], P + [4, 4]]
    ids = ["q3", "p1", "q1", "p4", "solo", "p2"]
    # Groups (min_shared_tokens=4): {p1, p4, p2} share P, {q3, q1} share Q, {solo} alone.
    groups = prefix_groups(toks, ids, min_shared_tokens=4)
    assert sorted(sorted(ids[i] for i in g) for g in groups) == [["p1", "p2", "p4"], ["q1", "q3"], ["solo"]]
    order = [ids[i] for i in submission_order(toks, ids, min_shared_tokens=4)]
    # Within a group shortest first; groups by their shortest prompt: solo(2), P-group(5), Q-group(5, tie -> id).
    assert order == ["solo", "p1", "p2", "p4", "q1", "q3"]
    # Length sort alone ignores prefixes: lengths 7,5,5,8,2,6 -> solo, p1, q1, p2, q3, p4.
    flat = [ids[i] for i in submission_order(toks, ids, group_by_prefix=False)]
    assert flat == ["solo", "p1", "q1", "p2", "q3", "p4"]
    # Neither tactic: input order; a seeded shuffle is a permutation that repeats for the same seed.
    assert submission_order(toks, ids, group_by_prefix=False, sort_by_length=False) == list(range(6))
    s1 = submission_order(toks, ids, group_by_prefix=False, sort_by_length=False, shuffle_seed=3)
    assert sorted(s1) == list(range(6))
    assert s1 == submission_order(toks, ids, group_by_prefix=False, sort_by_length=False, shuffle_seed=3)


def test_short_shared_prefix_does_not_group():
    # Sharing 3 tokens with a 4-token threshold: no group (less than a KV block saves nothing).
    groups = prefix_groups([[1, 2, 3, 7], [1, 2, 3, 8]], ["a", "b"], min_shared_tokens=4)
    assert len(groups) == 2


def test_chunks_cut_in_order():
    assert chunks(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    with pytest.raises(ValueError):
        chunks([1], 0)


def test_run_without_vllm_says_which_python_to_use(tmp_path, capsys):
    pytest.importorskip("numpy")
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is importable here")
    except ImportError:
        pass
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "x", "max_tokens": 1}) + "\n")
    assert main(["batch", "run", str(path), "-o", str(tmp_path / "o.jsonl"), "--model", "m"]) == 2
    assert ".venv-vllm/bin/python -m servebook batch run" in capsys.readouterr().err


def test_jsonl_requests_reads_on_demand_what_parse_reads_at_once(tmp_path):
    from servebook.batch.requests import JsonlRequests

    rows = lines({"id": "a", "prompt": "héllo wörld", "max_tokens": 2},   # non-ASCII: byte offsets, not chars
                 "", {"prompt": "x"}, {"id": "b", "prompt_token_ids": [1, 2], "max_tokens": 1},
                 {"id": "a", "prompt": "dup", "max_tokens": 1}, {"id": "c", "prompt": "z"})
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    eager, eager_problems = parse_request_lines(rows, default_max_tokens=3)
    lazy = JsonlRequests(path, default_max_tokens=3)
    assert len(lazy) == len(eager) == 3
    assert [lazy[i] for i in range(3)] == eager
    assert lazy.ids == ["a", "b", "c"]
    assert [(p.line, p.id) for p in lazy.problems] == [(p.line, p.id) for p in eager_problems] == [(3, None), (5, "a")]


def test_key_grouping_matches_lexicographic_grouping():
    # Two independent ways to find groups: sort-and-compare neighbours vs. equal digests of the head.
    import random

    from servebook.batch.ordering import prefix_key

    rng = random.Random(5)
    heads = [[rng.randrange(3) for _ in range(6)] for _ in range(5)]
    toks = [rng.choice(heads)[: rng.randint(3, 6)] + [rng.randrange(3) for _ in range(rng.randint(0, 4))]
            for _ in range(200)]
    ids = [f"r{i}" for i in range(200)]
    by_sort = sorted(sorted(g) for g in prefix_groups(toks, ids, min_shared_tokens=4))
    by_key: dict = {}
    for i, t in enumerate(toks):
        k = prefix_key(t, 4)
        by_key.setdefault(k if k is not None else ("solo", i), []).append(i)
    assert by_sort == sorted(sorted(g) for g in by_key.values())
