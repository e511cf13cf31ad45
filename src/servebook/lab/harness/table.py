"""Predict-then-measure tables: the reader's guess, the calculator's prediction, the engine's number."""
from __future__ import annotations


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def side_by_side(rows: list[dict], columns: list[str] | None = None) -> str:
    """A plain-text table of ``rows`` (dicts), columns in the order given (default: first row's keys)."""
    if not rows:
        return "(no rows)"
    cols = columns or list(rows[0])
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def ratio(measured: float | None, predicted: float | None) -> float | None:
    """measured / predicted, or None when either is missing or the prediction is 0."""
    if measured is None or not predicted:
        return None
    return measured / predicted


def markdown_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """The rows of :func:`side_by_side` as a Markdown table (for a rendered page), same number format."""
    if not rows:
        return "(no rows)"
    cols = columns or list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" for _ in cols) + "|"]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
