"""Interview drills (page 6.26): questions as data, answers computed or graded by the library.

The drills live in ``servebook/data/drills.toml``. Each has an ``id``, the chapter ``section``
it drills, a ``kind`` (see :data:`KINDS`), the ``question``, a worked ``answer`` (mechanism
first, number second) and optionally a common wrong answer and why it is wrong (``pitfall``).

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

Modules (one concept each; the names below are re-exported here):
    model     what a drill is, the chapter's sections and kinds, loading data/drills.toml
    exhibit   recorded material shown with a question
    grading   grading a typed answer
    render    Markdown and HTML for the page and the notebook, per-section summary
    calls     the library calls drills compute their numbers with
"""
from __future__ import annotations

from servebook.drills.exhibit import EXHIBIT_ROOTS, Exhibit
from servebook.drills.grading import Grade, check_answer, parse_number
from servebook.drills.model import CALLS_MODULE, DATA_FILE, KINDS, SECTIONS, Drill, get_drill, load_drills
from servebook.drills.render import (grade_html, question_html, render_html, render_markdown, render_section, summary,
                                     tolerance_text)
from servebook.errors import DrillError

__all__ = [
    "CALLS_MODULE", "DATA_FILE", "EXHIBIT_ROOTS", "KINDS", "SECTIONS", "Drill", "DrillError", "Exhibit", "Grade",
    "check_answer", "get_drill", "grade_html", "load_drills", "parse_number", "question_html", "render_html",
    "render_markdown", "render_section", "summary", "tolerance_text",
]
