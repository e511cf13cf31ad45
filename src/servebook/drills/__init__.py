"""Interview drills (page 6.26): questions as data, answers computed or graded by the library.

The drills live in ``servebook/data/drills.toml``. Each has an ``id``, the chapter ``section``
it drills, a ``kind`` (see :data:`KINDS`), the ``question``, a worked ``answer`` (mechanism
first, number second) and optionally what the draft chapter got wrong (``draft_says``).

* ``numeric`` drills (and numeric ``debugging``/``design`` ones) name a function of
  :mod:`servebook.drills.calls` and its arguments; the expected number is computed, never
  typed. ``variants`` lists alternative argument values; a seed picks one of each
  (seed 0 is the base question), so a reader can drill the same mechanism on another model.
  A typed answer is right when it is within ``rel_tol`` (relative) or ``abs_tol`` of the
  computed one; a factor-of-two slip (forgetting that K and V are both cached) never is.
* ``concept``/``design``/``debugging`` drills without a call are graded on ideas: ``keywords``
  is a list of groups, each a list of words any one of which shows the idea was named.
* ``exhibit`` attaches real recorded material (a start-up log, a ``/metrics`` snapshot, a
  ``vllm bench serve`` result, an H200 step timing) shown with the question; lines are
  selected by a regular expression from the recorded file, never retyped.

Placeholders in question/answer text: ``{arg}`` for a drill argument, ``{value}`` for the
computed answer (with a format spec, e.g. ``{value:.2f}``), ``{fact_name}`` for a ``facts``
entry (another library call).
"""
from __future__ import annotations

import importlib
import math
import random
import re
import string
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from servebook.errors import ServebookError

DATA_FILE = Path(__file__).resolve().parent.parent / "data" / "drills.toml"

KINDS = ("concept", "numeric", "debugging", "design")

#: Section numbers and titles of the chapter (from the draft's outline).
SECTIONS = {
    "6.1": "Why a serving engine at all",
    "6.2": "PagedAttention",
    "6.3": "Continuous batching",
    "6.4": "Prefill and decode are different machines",
    "6.5": "Where the GPU's memory actually goes",
    "6.6": "gpu-memory-utilization",
    "6.7": "max-model-len",
    "6.8": "KV cache dtype",
    "6.9": "max-num-seqs",
    "6.10": "max-num-batched-tokens",
    "6.11": "Chunked prefill",
    "6.12": "Prefix caching",
    "6.13": "Async scheduling and CUDA graphs",
    "6.14": "TP, PP, DP and EP",
    "6.15": "MoE versus dense",
    "6.16": "How speculative decoding works",
    "6.17": "Assistant draft models",
    "6.18": "MTP and the other methods",
    "6.19": "Tuning acceptance",
    "6.20": "The 15k deployment",
    "6.21": "The 30k deployment",
    "6.22": "Sizing a ten-million-request job",
    "6.23": "Batch-mode tactics",
    "6.24": "Defaults: what to keep, what to set",
    "6.25": "Key takeaways",
}

#: Where exhibits come from: shipped data (``shipped``) or recorded results (``records``), and the
#: default file inside a folder.
EXHIBIT_ROOTS = {
    "startup_log": (("shipped", "startup_logs"), "startup.log"),
    "capture": (("shipped", "bench"), None),
    "step_timing": (("records", "step_timing"), None),
    "lab": (("records", "labs"), None),
}

CALLS_MODULE = "servebook.drills.calls"


class DrillError(ServebookError):
    """A drill id, seed, answer or data entry that cannot be used."""


@dataclass(frozen=True)
class Exhibit:
    """Recorded material shown with a question.

    Attributes:
        source: ``"startup_log"`` (a shipped GPU start-up, servebook/data/startup_logs), ``"capture"``
            (the shipped capture, servebook/data/bench), ``"step_timing"`` (recorded results'
            step_timing/) or ``"lab"`` (a recorded lab result, the results' labs/*.json;
            see :mod:`servebook.records`).
        name: the folder (or, for step timing and labs, the JSON file's stem).
        file: the file inside a capture folder (``metrics_after.txt``, ``bench_stdout.txt`` ...).
        grep: regular expression; only matching lines are shown (all lines when empty; for
            a lab, the lines of each selected point's engine log, none when empty).
        points: lab only: which ``measurements.points`` to show, ``{key: [values]}``.
        fields: lab only: dotted paths inside a point (``bench.summary.output_throughput``)
            shown as the file spells them, ``"leaf": value``, before the log lines.
        max_line_chars: longer lines are cut (with "...") so the page stays readable.
        caption: one line saying what the material is and where it was recorded.
    """

    source: str
    name: str
    file: str | None = None
    grep: str = ""
    max_line_chars: int = 400
    caption: str = ""
    points: dict = field(default_factory=dict)
    fields: tuple = ()

    def path(self) -> Path:
        from servebook.records import results_path
        from servebook.shipped import DATA_DIR

        if self.source not in EXHIBIT_ROOTS:
            raise DrillError(f"exhibit source {self.source!r} is not one of {', '.join(EXHIBIT_ROOTS)}")
        (where, folder), default = EXHIBIT_ROOTS[self.source]
        base = DATA_DIR / folder if where == "shipped" else results_path(folder)
        if self.source in ("step_timing", "lab"):
            return base / f"{self.name}.json"
        return base / self.name / (self.file or default or "")

    def lines(self) -> list[str]:
        """The selected lines of the recorded file, unedited except for cutting long lines."""
        p = self.path()
        if not p.is_file():
            raise DrillError(f"exhibit {p} does not exist; record it first (see the folder's README)")
        text = p.read_text(errors="replace")
        if self.source == "lab":
            return self._lab_lines(text)
        if self.source == "step_timing":
            import json

            data = json.loads(text)
            text = "\n".join(c.get("log", "") for c in data["cases"])
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)
        pattern = re.compile(self.grep) if self.grep else None
        out = []
        for line in text.splitlines():
            if pattern is None or pattern.search(line):
                out.append(line if len(line) <= self.max_line_chars else line[: self.max_line_chars] + " ...")
        if not out:
            raise DrillError(f"exhibit {p}: no line matches {self.grep!r}")
        return out

    def _lab_lines(self, text: str) -> list[str]:
        """Selected points of a lab result: each field as the JSON file writes it, then matching log lines."""
        import json

        from servebook.drills.calls import repo_relative, value_at

        points = json.loads(text).get("measurements", {}).get("points", [])
        chosen = [pt for pt in points if all(pt.get(k) in v for k, v in self.points.items())]
        if not chosen:
            raise DrillError(f"exhibit {self.path()}: no measurement point matches {self.points!r}")
        pattern = re.compile(self.grep) if self.grep else None
        out = []
        for pt in chosen:
            for path in self.fields:
                value = value_at(pt, path, f"exhibit {repo_relative(self.path())}",
                                 f"measurements.points[{points.index(pt)}]", DrillError)
                out.append(f'"{path.split(".")[-1]}": {json.dumps(value)}')
            if pattern is not None:
                for line in re.sub(r"\x1b\[[0-9;]*m", "", pt.get("log", "")).splitlines():
                    if pattern.search(line):
                        out.append(line if len(line) <= self.max_line_chars else line[: self.max_line_chars] + " ...")
        return out

    def text(self) -> str:
        return "\n".join(self.lines())


@dataclass(frozen=True)
class Drill:
    """One interview question (see the module docstring for the fields' meaning)."""

    id: str
    section: str
    kind: str
    question: str
    answer: str
    call: str | None = None
    args: dict = field(default_factory=dict)
    variants: dict = field(default_factory=dict)
    unit: str = ""
    rel_tol: float = 0.03
    abs_tol: float = 0.0
    keywords: tuple[tuple[str, ...], ...] = ()
    facts: dict = field(default_factory=dict)
    exhibit: Exhibit | None = None
    draft_says: str = ""

    @property
    def numeric(self) -> bool:
        """True when the answer is a number computed by a library call."""
        return self.call is not None

    @property
    def section_title(self) -> str:
        return SECTIONS[self.section]

    @property
    def num_variants(self) -> int:
        """Distinct argument combinations the seeds can pick (1 without variants)."""
        n = 1
        for values in self.variants.values():
            n *= len(values)
        return n

    # ---------------------------------------------------------------- arguments
    def args_for(self, seed: int = 0) -> dict:
        """Arguments for ``seed``: seed 0 is the base question; others pick each variant list's value."""
        if not isinstance(seed, int) or seed < 0:
            raise DrillError(f"seed {seed!r} is not allowed; use an integer >= 0")
        args = dict(self.args)
        if seed and self.variants:
            rng = random.Random(f"{self.id}:{seed}")
            for key in sorted(self.variants):
                args[key] = rng.choice(self.variants[key])
        return args

    def variant_args(self) -> list[dict]:
        """Every argument combination the variants allow (the base arguments first)."""
        import itertools

        keys = sorted(self.variants)
        combos = [dict(self.args)]
        for values in itertools.product(*(self.variants[k] for k in keys)):
            args = {**self.args, **dict(zip(keys, values))}
            if args not in combos:
                combos.append(args)
        return combos

    # ---------------------------------------------------------------- answers
    def compute(self, args: dict) -> float:
        """The answer for explicit arguments (in :attr:`unit`)."""
        if not self.numeric:
            raise DrillError(f"drill {self.id} is a {self.kind} question without a computed answer")
        return float(_call(self.call, args))

    def expected(self, seed: int = 0) -> float:
        """The computed answer for ``seed`` (in :attr:`unit`)."""
        return self.compute(self.args_for(seed))

    def facts_for(self, seed: int = 0) -> dict[str, float]:
        """Every ``facts`` entry computed for ``seed`` (``$arg`` in their args means the drill's arg)."""
        args = self.args_for(seed)
        out = {}
        for name, entry in self.facts.items():
            fargs = {k: (args[v[1:]] if isinstance(v, str) and v.startswith("$") else v)
                     for k, v in entry.get("args", {}).items()}
            out[name] = float(_call(entry["call"], fargs))
        return out

    def _fields(self, seed: int) -> dict[str, Any]:
        fields: dict[str, Any] = dict(self.args_for(seed))
        fields.update(self.facts_for(seed))
        if self.numeric:
            fields["value"] = self.expected(seed)
        fields["unit"] = self.unit
        return fields

    def question_text(self, seed: int = 0) -> str:
        """The question with this seed's arguments filled in."""
        return _fill(self.question, self._fields(seed), self.id)

    def answer_text(self, seed: int = 0) -> str:
        """The worked answer (mechanism, then the computed number) for this seed."""
        return _fill(self.answer, self._fields(seed), self.id)

    def is_accepted(self, value: float, seed: int = 0, *, expected: float | None = None) -> bool:
        """True when ``value`` is within tolerance of the computed answer (or of ``expected``)."""
        exp = self.expected(seed) if expected is None else expected
        return math.isclose(value, exp, rel_tol=self.rel_tol, abs_tol=self.abs_tol)


def _call(name: str, args: dict) -> Any:
    module, _, func = name.rpartition(".")
    if module != CALLS_MODULE:
        raise DrillError(f"drill calls must be functions of {CALLS_MODULE}, not {name!r}")
    fn = getattr(importlib.import_module(module), func, None)
    if fn is None:
        raise DrillError(f"{name} does not exist; add it to {CALLS_MODULE}")
    return fn(**args)


def _fill(template: str, fields: dict, drill_id: str) -> str:
    try:
        return string.Formatter().vformat(template.strip(), (), fields)
    except (KeyError, IndexError, ValueError) as exc:
        raise DrillError(f"drill {drill_id}: placeholder {exc} in its text has no value") from None


# -------------------------------------------------------------------- loading

def _drill_from_entry(e: dict, where: str) -> Drill:
    for key in ("id", "section", "kind", "question", "answer"):
        if key not in e:
            raise DrillError(f"{where}: a drill lacks {key!r}")
    if e["kind"] not in KINDS:
        raise DrillError(f"{where}: drill {e['id']} has kind {e['kind']!r}; use one of {', '.join(KINDS)}")
    if e["section"] not in SECTIONS:
        raise DrillError(f"{where}: drill {e['id']} names section {e['section']!r}; use 6.1 ... 6.25")
    if e["kind"] == "numeric" and "call" not in e:
        raise DrillError(f"{where}: numeric drill {e['id']} needs a 'call'")
    if "call" not in e and not e.get("keywords"):
        raise DrillError(f"{where}: drill {e['id']} needs a 'call' or 'keywords' to grade an answer")
    exhibit = Exhibit(**e["exhibit"]) if "exhibit" in e else None
    return Drill(
        id=e["id"], section=e["section"], kind=e["kind"], question=e["question"], answer=e["answer"],
        call=e.get("call"), args=dict(e.get("args", {})), variants=dict(e.get("variants", {})),
        unit=e.get("unit", ""), rel_tol=float(e.get("rel_tol", 0.03)), abs_tol=float(e.get("abs_tol", 0.0)),
        keywords=tuple(tuple(g) for g in e.get("keywords", ())), facts=dict(e.get("facts", {})),
        exhibit=exhibit, draft_says=e.get("draft_says", ""),
    )


@lru_cache(maxsize=4)
def _load(path: str) -> tuple[Drill, ...]:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise DrillError(f"{p} is not valid TOML: {exc}") from None
    drills = tuple(_drill_from_entry(e, str(p)) for e in data.get("drill", []))
    seen: set[str] = set()
    for d in drills:
        if d.id in seen:
            raise DrillError(f"{p}: drill id {d.id!r} appears twice; ids must be unique")
        seen.add(d.id)
    return drills


def load_drills(path: str | Path | None = None) -> list[Drill]:
    """Every drill, in file order (grouped by section there)."""
    return list(_load(str(path or DATA_FILE)))


def get_drill(drill_id: str, path: str | Path | None = None) -> Drill:
    """One drill by id; the error lists the ids that exist."""
    for d in load_drills(path):
        if d.id == drill_id:
            return d
    known = ", ".join(d.id for d in load_drills(path))
    raise DrillError(f"no drill {drill_id!r}; use one of: {known}")


# -------------------------------------------------------------------- grading

@dataclass(frozen=True)
class Grade:
    """The verdict on one typed answer.

    Attributes:
        drill_id, seed: what was answered.
        correct: True/False.
        given: the number read from the answer (numeric drills), else None.
        expected: the computed answer (numeric drills), else None.
        unit: unit of ``expected``.
        missing: idea groups the answer did not name (keyword-graded drills).
        message: one or two sentences saying why.
        explanation: the worked answer (mechanism first, number second).
    """

    drill_id: str
    seed: int
    correct: bool
    given: float | None
    expected: float | None
    unit: str
    missing: tuple[str, ...]
    message: str
    explanation: str


_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")
_SCALE = {"k": 1e3, "m": 1e6, "b": 1e9}


def parse_number(answer: str) -> float:
    """The first number in a typed answer ("4.0 GiB", "1,568,032", "24%", "2.5k")."""
    m = _NUMBER.search(answer or "")
    if not m:
        raise DrillError(f"no number in {answer!r}; type a number such as 4.2")
    value = float(m.group(0).replace(",", ""))
    tail = answer[m.end():].lstrip().lower()
    if tail[:1] in _SCALE and not tail[1:2].isalpha():
        value *= _SCALE[tail[:1]]
    return value


def _fmt(x: float) -> str:
    if x == int(x) and abs(x) >= 1:
        return f"{int(x):,}"
    return f"{x:.4g}"


def check_answer(drill: str | Drill, answer: str, seed: int = 0) -> Grade:
    """Grade a typed answer: numbers against the computed value, prose against the key ideas."""
    d = get_drill(drill) if isinstance(drill, str) else drill
    explanation = d.answer_text(seed)
    if d.numeric:
        given = parse_number(answer)
        exp = d.expected(seed)
        ok = d.is_accepted(given, seed)
        unit = f" {d.unit}" if d.unit else ""
        if ok:
            msg = f"Correct: {_fmt(exp)}{unit} (you said {_fmt(given)})."
        else:
            msg = f"Not quite: the library computes {_fmt(exp)}{unit}; you said {_fmt(given)}."
            if exp and abs(given / exp - 2) < 0.1:
                msg += " You are high by a factor of two: is something counted twice (K and V already included, or TP split missed)?"
            elif exp and abs(given / exp - 0.5) < 0.05:
                msg += " You are low by a factor of two: did you count only K, not K and V?"
        return Grade(d.id, seed, ok, given, exp, d.unit, (), msg, explanation)
    text = (answer or "").lower()
    missing = tuple(" / ".join(group) for group in d.keywords
                    if not any(word.lower() in text for word in group))
    ok = not missing
    if ok:
        msg = "You named every key idea. Compare your wording with the worked answer."
    else:
        msg = "Your answer does not mention: " + "; ".join(missing) + "."
    return Grade(d.id, seed, ok, None, None, d.unit, missing, msg, explanation)


# -------------------------------------------------------------------- rendering

def _admonition_body(text: str) -> str:
    return text.replace("```", "'''")


def tolerance_text(d: Drill) -> str:
    """How close a typed answer must be, in words."""
    if d.rel_tol:
        return f"accepted within {d.rel_tol * 100:g}%"
    if d.abs_tol:
        return f"accepted within {_fmt(d.abs_tol)} {d.unit}"
    return "exact answer expected"


def render_markdown(drill: str | Drill, seed: int = 0, *, folded: bool = True) -> str:
    """One drill as MyST markdown: question, exhibit, and the answer in a folded dropdown."""
    d = get_drill(drill) if isinstance(drill, str) else drill
    parts = [f"**{d.id}** ({d.kind}, §{d.section} {d.section_title})", "", d.question_text(seed), ""]
    if d.exhibit is not None:
        if d.exhibit.caption:
            parts += [f"*{d.exhibit.caption}*", ""]
        parts += ["````text", d.exhibit.text(), "````", ""]
    body = [_admonition_body(d.answer_text(seed))]
    if d.numeric:
        body += ["", f"Computed by `{d.call}({', '.join(f'{k}={v!r}' for k, v in d.args_for(seed).items())})`"
                 f" = **{_fmt(d.expected(seed))} {d.unit}**; {tolerance_text(d)}."]
    if d.draft_says:
        body += ["", f"**Where the draft goes wrong:** {d.draft_says.strip()}"]
    directive = ":::{dropdown} Answer" if folded else ":::{admonition} Answer"
    parts += [directive, *body, ":::", ""]
    return "\n".join(parts)


def render_section(section: str, seed: int = 0, *, drills: list[Drill] | None = None) -> str:
    """Every drill of one section as MyST markdown, answers folded."""
    if section not in SECTIONS:
        raise DrillError(f"section {section!r} is not in the chapter; use one of {', '.join(SECTIONS)}")
    chosen = [d for d in (load_drills() if drills is None else drills) if d.section == section]
    return "\n".join(render_markdown(d, seed) for d in chosen)


def render_html(drill: str | Drill, seed: int = 0) -> str:
    """One drill as HTML with the answer folded in ``<details>`` (for notebooks and widgets)."""
    import html

    d = get_drill(drill) if isinstance(drill, str) else drill
    out = [f"<p><b>{html.escape(d.id)}</b> ({d.kind}, §{d.section} {html.escape(d.section_title)})</p>",
           f"<p>{html.escape(d.question_text(seed))}</p>"]
    if d.exhibit is not None:
        out.append(f"<pre>{html.escape(d.exhibit.text())}</pre>")
    out.append(f"<details><summary>Answer</summary><p>{html.escape(d.answer_text(seed))}</p></details>")
    return "\n".join(out)


def question_html(drill: str | Drill, seed: int = 0) -> str:
    """The question (and its exhibit) as HTML, without the answer: what a self-check shows first."""
    import html

    d = get_drill(drill) if isinstance(drill, str) else drill
    out = [f"<p><b>{html.escape(d.id)}</b> ({d.kind}, §{d.section} {html.escape(d.section_title)})</p>",
           f"<p>{html.escape(d.question_text(seed))}</p>"]
    if d.exhibit is not None:
        if d.exhibit.caption:
            out.append(f"<p><i>{html.escape(d.exhibit.caption)}</i></p>")
        out.append(f"<pre style='white-space: pre-wrap; font-size: 85%'>{html.escape(d.exhibit.text())}</pre>")
    if d.numeric:
        out.append(f"<p>Answer with a number in {html.escape(d.unit or 'the unit asked')}.</p>")
    else:
        out.append("<p>Answer in a sentence or two; it is checked for the key ideas.</p>")
    return "\n".join(out)


def grade_html(grade: Grade) -> str:
    """A :class:`Grade` as HTML: verdict, then the worked explanation."""
    import html

    colour = "#1a7f37" if grade.correct else "#b35900"
    verdict = "Correct" if grade.correct else "Not yet"
    return (f"<p style='color:{colour}'><b>{verdict}.</b> {html.escape(grade.message)}</p>"
            f"<p><b>Worked answer.</b> {html.escape(grade.explanation)}</p>")


def summary(drills: list[Drill] | None = None) -> dict[str, dict[str, int]]:
    """Drill counts ``{section: {kind: n}}`` in chapter order."""
    drills = load_drills() if drills is None else drills
    out: dict[str, dict[str, int]] = {s: {} for s in SECTIONS}
    for d in drills:
        out[d.section][d.kind] = out[d.section].get(d.kind, 0) + 1
    return out


__all__ = [
    "KINDS", "SECTIONS", "Drill", "DrillError", "Exhibit", "Grade", "check_answer", "get_drill",
    "grade_html", "load_drills", "parse_number", "question_html", "render_html", "render_markdown", "render_section", "summary",
    "tolerance_text",
]
