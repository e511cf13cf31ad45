"""`servebook batch run` refuses a bad input file before any engine starts (no tokenizer needed).

The slow way this used to fail: a 400-line file whose every line had a misspelt sampling key
loaded the engine first and was refused 57 s later. The refusal must come from reading the
file alone: the engine factory here raises if it is called, and the CLI run happens in the
book's environment, which has no vLLM to start.
"""
import json
import subprocess
import sys
import time

import pytest

from servebook.batch.requests import parse_request_lines, summarize_problems
from servebook.cli import build_parser
from servebook.commands.batch import run_run
from servebook.errors import ServebookError


def no_engine(model, **kwargs):
    raise AssertionError("an engine was constructed for an input file that cannot run")


def write_lines(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def typo_file(tmp_path, n=400):
    return write_lines(tmp_path / "in.jsonl", [{"id": i, "prompt": "hello", "max_tokens": 8,
                                                "sampling": {"temprature": 0}} for i in range(n)])


def batch_run_args(path, *extra):
    return build_parser().parse_args(["batch", "run", str(path), "-o", str(path.with_name("out.jsonl")),
                                      "--model", "never-loaded", *extra])


def test_400_lines_with_one_typo_are_one_line_of_report_and_no_engine(tmp_path):
    src = typo_file(tmp_path)
    started = time.monotonic()
    with pytest.raises(ServebookError) as err:
        run_run(batch_run_args(src), make_engine=no_engine)
    elapsed_s = time.monotonic() - started
    text = str(err.value)
    assert text.startswith("400 of 400 input lines cannot run; no engine was started")
    assert (f"{src} lines 1-400 (400 lines): unknown \"sampling\" keys ['temprature'] "
            "(did you mean 'temprature' -> 'temperature'?)") in text
    assert len(text.splitlines()) == 2                       # the headline and one grouped problem
    assert not (tmp_path / "out.jsonl").exists()
    assert elapsed_s < 5, elapsed_s                           # reading 400 lines, not loading a model


def test_each_kind_of_problem_is_named_with_file_and_line(tmp_path):
    src = write_lines(tmp_path / "mixed.jsonl", [
        {"id": "ok", "prompt": "fine", "max_tokens": 4},                                   # 1
        {"id": "t", "prompt": "x", "max_tokens": 4, "sampling": {"temperature": "cold"}},  # 2 bad type
        {"id": "m", "prompt": "x"},                                                          # 3 no max_tokens
        '{"id": "j", "prompt": ',                                                           # 4 torn JSON
        {"id": "t2", "prompt": "x", "max_tokens": 4, "sampling": {"temperature": "cold"}},  # 5 same as 2
        {"id": "s", "prompt": "x", "max_tokens": 4, "sampling": {"stop": [1, 2]}},          # 6
    ])
    with pytest.raises(ServebookError) as err:
        run_run(batch_run_args(src), make_engine=no_engine)
    text = str(err.value)
    assert text.startswith("5 of 6 input lines cannot run")
    assert f'{src} lines 2, 5 (2 lines): bad "sampling" value: "temperature" must be a number, got "cold"' in text
    assert f'{src}:3: missing "max_tokens"' in text
    assert f"{src}:4: not valid JSON" in text
    assert f'{src}:6: bad "sampling" value: "stop" must be a string or a list of strings, got [1, 2]' in text


def test_skip_invalid_goes_on_to_the_engine(tmp_path):
    src = typo_file(tmp_path, n=3)
    with pytest.raises(AssertionError, match="an engine was constructed"):
        run_run(batch_run_args(src, "--skip-invalid"), make_engine=no_engine)


@pytest.mark.parametrize("sampling, ok", [
    ({"temperature": 0, "top_p": 0.9, "top_k": 5, "stop": "\n", "ignore_eos": True}, True),
    ({"stop": ["a", "b"], "stop_token_ids": [2, 3]}, True),
    ({"top_k": 2.5}, False),
    ({"ignore_eos": 1}, False),
    ({"temperature": True}, False),
    ({"stop_token_ids": [1, "2"]}, False),
])
def test_sampling_value_types(sampling, ok):
    requests, problems = parse_request_lines([json.dumps({"id": 1, "prompt": "x", "max_tokens": 1,
                                                          "sampling": sampling})])
    assert (len(requests), len(problems)) == ((1, 0) if ok else (0, 1))


def test_line_ranges_in_the_summary():
    _, problems = parse_request_lines(["{"] * 3 + ['{"id": 1, "prompt": "x", "max_tokens": 1}'] + ["{"] * 2)
    assert summarize_problems(problems, "f.jsonl").startswith("f.jsonl lines 1-3, 5-6 (5 lines): not valid JSON")


def test_cli_refuses_without_vllm_and_without_a_traceback(tmp_path):
    """The book's environment has no vLLM: reaching the engine would fail with a different message."""
    src = typo_file(tmp_path)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "servebook", "batch", "run", str(src), "-o",
                           str(tmp_path / "out.jsonl"), "--model", "never-loaded"],
                          capture_output=True, text=True, timeout=60)
    elapsed_s = time.monotonic() - started
    print(f"refusal of a 400-line bad file by the CLI: {elapsed_s:.2f} s")
    assert proc.returncode == 2
    assert "no engine was started" in proc.stderr and "lines 1-400 (400 lines)" in proc.stderr
    assert "Traceback" not in proc.stderr and "vLLM" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 2


def test_ray_command_refuses_before_importing_ray(tmp_path):
    """`servebook batch ray` checks every shard first; the book's environment has no Ray to import."""
    good = write_lines(tmp_path / "s0.jsonl", [{"id": "a", "prompt": "x", "max_tokens": 2}])
    bad = typo_file(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "servebook", "batch", "ray", str(good), str(bad), "-o",
                           str(tmp_path / "out.jsonl"), "--model", "never-loaded", "--address", "10.0.0.1:6379"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "400 of 401 input lines cannot run; no engine was started. Fix them, or pass --skip-invalid" in proc.stderr
    assert f"{bad} lines 1-400 (400 lines): unknown" in proc.stderr
    assert "ray[data]" not in proc.stderr and "Traceback" not in proc.stderr
