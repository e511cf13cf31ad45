"""Reading a GPU lab page's text in tests (lab pages are not executed at build, so their notes quote
recorded numbers as text, and the tests compare that text with the result files)."""
from __future__ import annotations

from pathlib import Path

LABS_DIR = Path(__file__).resolve().parents[1] / "labs"


def lab_text(stem: str) -> str:
    """The whole page ``labs/<stem>.md`` with runs of whitespace (line breaks too) made one space."""
    return " ".join((LABS_DIR / f"{stem}.md").read_text().split())


def lab_note(stem: str) -> str:
    """The page's first ``{note}`` admonition (the recorded-run note), whitespace made one space."""
    text = (LABS_DIR / f"{stem}.md").read_text()
    start = text.index("```{note}")
    return " ".join(text[start:text.index("```", start + 3)].split())
