"""How many numbers a chapter paragraph asks the reader to hold (issue 38: "at most ~5 numbers").

A paragraph of a teaching page (book/06-*.md) that carries ten glued figures reads as a table
written out in sentences: the reader loses the argument. This file counts, per prose paragraph,
the numbers a reader meets: every glued value (``{glue:text}`...```, ``{glue}`...```) and every
numeral written in the text. It does not count what is not a quantity: inline code (a flag and
its value are an instruction, not a figure), the targets of roles and links, section numbers
(``6.11``), and numerals inside a name (``H200``, ``Qwen3-32B``, ``fp8``, a family's version as in
``Llama 3.1 70B``; ``TP 2`` counts once).

Tables, code cells, headings, directive options and figure captions are not paragraphs; a list
item is one. Pages not yet trimmed are listed in ``PAGES_STILL_DENSE``; a listed page that is no
longer dense fails, so the list only shrinks.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parents[1] / "book"
#: The most numbers one paragraph of a chapter page may carry (issue 38: "at most ~5").
MAX_NUMBERS = 5
#: Pages whose paragraphs have not been trimmed yet: page -> why it is still listed.
PAGES_STILL_DENSE: dict[str, str] = {}

_GLUE = re.compile(r"\{glue(?::text)?\}`[^`]*`")
_ROLE = re.compile(r"\{[a-z:]+\}`[^`]*`")          # {ref}`...`, {doc}`...`, {numref}`...`, {term}`...`
_CODE = re.compile(r"``[^`]+``|`[^`]*`")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_SECTION = re.compile(r"(?<![\d.,])6\.\d{1,2}(?![\d,])")
#: A model family's version is part of its name: Llama 3.1 70B, Gemma 4 31B, Qwen 3.
_MODEL_NAME = re.compile(r"\b(Llama|Gemma|Qwen|Mistral|Mixtral|DeepSeek|Phi|GLM|GPT)[ -]?\d[\d.]*")
#: A numeral standing alone: 16,384  0.90  2.5x  15%  ~70  -1.5  (not a part of a word such as H200).
_NUMERAL = re.compile(r"(?<![\w.\-])[~+\-−]?\d[\d,]*(?:\.\d+)?(?:[x×%]|\b)(?![\w\-])")


def numbers_in(paragraph: str) -> int:
    """How many numbers the paragraph's reader meets (glued values plus numerals in the text)."""
    glued = len(_GLUE.findall(paragraph))
    text = _GLUE.sub(" ", paragraph)
    for pattern in (_ROLE, _CODE, _LINK_TARGET, _SECTION, _MODEL_NAME):
        text = pattern.sub(" ", text)
    return glued + len(_NUMERAL.findall(text))


def paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line, text) of every prose paragraph and list item outside code, tables and directives."""
    found: list[tuple[int, str]] = []
    block: list[str] = []
    start = 0
    fence = None

    def flush():
        if block:
            found.append((start, " ".join(block)))
            block.clear()

    prose_fences: list[str] = []   # open prose directives (note, tip, ...): their bodies are paragraphs
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence) and stripped.strip("`~") == "":
                fence = None
            continue
        if prose_fences and stripped == prose_fences[-1]:
            flush()
            prose_fences.pop()
            continue
        opener = re.match(r"^(`{3,}|~{3,})(.*)$", stripped)
        if opener:
            flush()
            # A prose directive keeps its body as paragraphs; code and other directives do not.
            if re.match(r"\{(note|tip|important|warning|admonition|seealso|attention|caution|hint)\}", opener.group(2)):
                prose_fences.append(opener.group(1))
            else:
                fence = opener.group(1)
            continue
        if (not stripped or stripped.startswith(("|", "#", ":", "+++", "<", "$$", "---"))
                or re.match(r"^\([\w:.-]+\)=$", stripped)):
            flush()
            continue
        if re.match(r"^([-*]|\d+\.)\s", stripped):
            flush()
        if not block:
            start = number
        block.append(stripped)
    flush()
    return found


def dense_paragraphs(page: Path, limit: int = MAX_NUMBERS) -> list[tuple[int, int]]:
    """(line, count) of each paragraph of the page that carries more than ``limit`` numbers."""
    return [(line, n) for line, para in paragraphs(page.read_text()) if (n := numbers_in(para)) > limit]


CHAPTER = sorted(BOOK.glob("06-*.md"))


@pytest.mark.parametrize("page", CHAPTER, ids=lambda p: p.name)
def test_a_chapter_paragraph_carries_at_most_a_few_numbers(page):
    dense = dense_paragraphs(page)
    if page.name in PAGES_STILL_DENSE:
        assert dense, f"book/{page.name} is no longer dense: remove it from PAGES_STILL_DENSE"
        return
    assert not dense, (f"book/{page.name}: paragraphs at lines {dense} (line, numbers) carry more than "
                       f"{MAX_NUMBERS} numbers; move the figures into a table or a figure, or say less")


def test_the_counter_counts_glued_values_and_numerals_but_not_names_code_or_sections():
    para = ("At {glue:text}`x:.0f` requests the H200 holds 16,384 tokens, 2.5x more than 6.11's "
            "`--max-num-seqs 256` and Qwen3-32B's 15% ({ref}`sec-1`, [link](a/b/3.md)).")
    assert numbers_in(para) == 4
    assert numbers_in("No numbers at all in H200 or fp8 or gpt-oss-20b.") == 0
    assert numbers_in("Gemma 4 31B drafted by Llama 3.1 8B at TP 2") == 1
    page = "# T\n\nOne 1 two 2.\nthree 3\n\n```{code-cell} ipython3\nx = 1 2 3 4 5 6 7 8\n```\n\n| 1 | 2 |\n- 1 2\n- 3\n"
    assert [(line, numbers_in(p)) for line, p in paragraphs(page)] == [(3, 3), (11, 2), (12, 1)]


def test_a_wrapped_parenthesis_and_an_admonition_keep_their_paragraphs():
    page = ("Text 1 2\n({glue:text}`a` and 3)\n\n(sec-x)=\n## H\n\n```{note}\nInside 4 5.\n```\n\nAfter 6 7 8.\n"
            "\n```python\nx = 9\n```\n")
    assert [(line, numbers_in(p)) for line, p in paragraphs(page)] == [(1, 4), (8, 2), (11, 3)]


def test_the_counter_finds_a_dense_paragraph(tmp_path):
    page = tmp_path / "06-99-x.md"
    page.write_text("# T\n\n" + " ".join(f"{{glue:text}}`v{i}`" for i in range(MAX_NUMBERS + 1)) + "\n\nShort 1.\n")
    assert dense_paragraphs(page) == [(3, MAX_NUMBERS + 1)]
