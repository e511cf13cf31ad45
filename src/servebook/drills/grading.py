"""Grading a typed answer: numbers within a tolerance, ideas by keyword groups."""
from __future__ import annotations

import re
from dataclasses import dataclass

from servebook.drills.model import Drill, get_drill
from servebook.errors import DrillError

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


def format_number(x: float) -> str:
    """A number as answers show it: whole numbers with thousands separators, else 4 significant digits."""
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
            msg = f"Correct: {format_number(exp)}{unit} (you said {format_number(given)})."
        else:
            msg = f"Not quite: the library computes {format_number(exp)}{unit}; you said {format_number(given)}."
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
