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
#: Plain multipliers after a number ("2.5k tokens", "1.5M", "7b"), case-insensitive like the old parser.
_SCALE = {"k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "bn": 1e9}

#: Units a drill answer may carry: name -> (dimension, size in the dimension's base unit).
#: Bytes: binary KiB/MiB/GiB/TiB (2**10 ...), decimal kB/KB/MB/GB/TB (10**3 ...); seconds; percent.
UNITS: dict[str, tuple[str, float]] = {
    "B": ("bytes", 1), "byte": ("bytes", 1), "bytes": ("bytes", 1),
    "KiB": ("bytes", 2**10), "MiB": ("bytes", 2**20), "GiB": ("bytes", 2**30), "TiB": ("bytes", 2**40),
    "kB": ("bytes", 1e3), "KB": ("bytes", 1e3), "MB": ("bytes", 1e6), "GB": ("bytes", 1e9), "TB": ("bytes", 1e12),
    "ns": ("seconds", 1e-9), "us": ("seconds", 1e-6), "µs": ("seconds", 1e-6), "ms": ("seconds", 1e-3),
    "s": ("seconds", 1), "sec": ("seconds", 1), "secs": ("seconds", 1), "second": ("seconds", 1),
    "seconds": ("seconds", 1), "min": ("seconds", 60), "mins": ("seconds", 60), "minutes": ("seconds", 60),
    "h": ("seconds", 3600), "hr": ("seconds", 3600), "hrs": ("seconds", 3600), "hour": ("seconds", 3600),
    "hours": ("seconds", 3600),
    "%": ("percent", 1),
}
#: Binary byte units are unambiguous in any case ("gib", "KIB").
_UNITS_FOLDED = {k.lower(): v for k, v in UNITS.items() if k.endswith("iB")}
_DECIMAL_BYTES = {"kB", "KB", "MB", "GB", "TB"}
_TOKEN = re.compile(r"[A-Za-zµ]+|%")


def _match(answer: str) -> re.Match:
    m = _NUMBER.search(_ascii_minus(answer or ""))
    if not m:
        raise DrillError(f"no number in {answer!r}; type a number such as 4.2")
    return m


def _ascii_minus(text: str) -> str:
    """Typographic minus signs (U+2212, en dash) as "-", so "−128" is not read as 128."""
    return text.replace("\u2212", "-").replace("\u2013", "-")


def _unit_token(answer: str, m: re.Match) -> str:
    tail = _ascii_minus(answer)[m.end():].lstrip()
    t = _TOKEN.match(tail)
    return t.group(0) if t else ""


def _unit(token: str) -> tuple[str, float] | None:
    return UNITS.get(token) or _UNITS_FOLDED.get(token.lower())


def parse_number(answer: str) -> float:
    """The first number in a typed answer ("4.0 GiB", "1,568,032", "24%", "2.5k"), without unit conversion.

    A plain multiplier right after it scales it: k = 10**3, M = 10**6, G or b = 10**9 ("2.5k" = 2500).
    """
    m = _match(answer)
    value = float(m.group(0).replace(",", ""))
    scale = _SCALE.get(_unit_token(answer, m).lower())
    return value * scale if scale else value


def parse_quantity(answer: str, unit: str) -> float:
    """The first number of a typed answer, in ``unit`` (the drill's unit).

    A byte, time or percent unit after the number is converted ("131072 B" = 128 KiB,
    "0.125 MiB" = 128 KiB, "128 GiB" = 134,217,728 KiB, "9 ms" = 0.0025 h); kB/KB/MB/GB/TB are
    decimal (10**3 ...), KiB/MiB/GiB binary (2**10 ...). Without a unit the number is taken in
    ``unit``; k, M, G (and b for billions, where ``unit`` is not bytes) scale it.

    Raises:
        DrillError: no number, or a unit of another kind than ``unit`` ("128 ms" for a KiB answer).
    """
    m = _match(answer)
    value = float(m.group(0).replace(",", ""))
    token = _unit_token(answer, m)
    want = _unit(unit)
    got = _unit(token) if token else None
    if token == "B" and (want is None or want[0] != "bytes"):
        got = None  # "7B" where the answer is not in bytes: billions, as before
    if got is None and want and want[0] == "bytes" and token.upper() in ("K", "M", "G", "T"):
        p = token.upper()
        raise DrillError(f"{answer!r}: is {p} a binary {p}iB ({UNITS[p + 'iB'][1]:,.0f} bytes) or a decimal "
                         f"{p if p != 'K' else 'k'}B ({UNITS[('k' if p == 'K' else p) + 'B'][1]:,.0f} bytes)? "
                         f"write the unit out, e.g. {m.group(0)} {p}iB")
    if got is None:
        scale = _SCALE.get(token.lower())
        if scale and not (token.lower() == "m" and want and want[0] == "seconds"):
            value *= scale
        return value
    if want is None or want[0] != got[0]:
        same = [k for k in ("B", "KiB", "MiB", "GiB", "ms", "s", "h") if want and UNITS[k][0] == want[0] and k != unit]
        asked = f" (or {', '.join(same)}, converted)" if same else ""
        raise DrillError(f"{answer!r} is in {token} ({got[0]}), but this answer is a number of "
                         f"{unit or 'the unit asked'}; give it in {unit}{asked}")
    return value * got[1] / want[1]


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
        given = parse_quantity(answer, d.unit)
        exp = d.expected(seed)
        ok = d.is_accepted(given, seed)
        unit = f" {d.unit}" if d.unit else ""
        said, token = format_number(given), _unit_token(answer, _match(answer))
        if _unit(token) and _unit(d.unit) and token != d.unit:
            said = f"{_match(answer).group(0)} {token} = {format_number(given)}{unit}"
        if ok:
            msg = f"Correct: {format_number(exp)}{unit} (you said {said})."
        else:
            msg = f"Not quite: the library computes {format_number(exp)}{unit}; you said {said}."
            binary = token[0].upper() + "iB" if token in _DECIMAL_BYTES else None
            if binary and d.is_accepted(given * UNITS[binary][1] / UNITS[token][1], seed):
                msg += (f" {token} is decimal ({UNITS[token][1]:,.0f} bytes) and {binary} binary "
                        f"({UNITS[binary][1]:,.0f} bytes): did you mean {binary}?")
            elif d.unit == "%" and token != "%" and d.is_accepted(given * 100, seed):
                msg += f" The answer is a percentage: {said} as a fraction is {format_number(given * 100)}%."
            elif exp and abs(given / exp - 2) < 0.1:
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
