"""Rendering drills for the page (6.26) and the notebook: Markdown, HTML, per-section summary."""
from __future__ import annotations

import html

from servebook.drills.grading import Grade, format_number
from servebook.drills.model import SECTIONS, Drill, get_drill, load_drills
from servebook.errors import DrillError

def _admonition_body(text: str) -> str:
    return text.replace("```", "'''")


def tolerance_text(d: Drill) -> str:
    """How close a typed answer must be, in words."""
    if d.rel_tol:
        return f"accepted within {d.rel_tol * 100:g}%"
    if d.abs_tol:
        return f"accepted within {format_number(d.abs_tol)} {d.unit}"
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
                 f" = **{format_number(d.expected(seed))} {d.unit}**; {tolerance_text(d)}."]
    if d.pitfall:
        body += ["", f"**Common mistake:** {d.pitfall.strip()}"]
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

