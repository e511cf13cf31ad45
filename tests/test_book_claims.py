"""Nothing the book names escapes the vLLM drift test.

Scans book/*.md, notebooks/*.md and labs/**/*.md for every ``--flag`` and every ``vllm:metric``
and fails when one is not listed in src/servebook/data/vllm_claims.toml (which
tests/engine/test_vllm_drift.py checks against the installed vLLM). A ``--flag`` on a line that
runs ``servebook`` is checked against servebook's own parser instead; flags of other tools must be
listed as ``[[other_flag]]``. Runs without vLLM (plain .venv).
"""
from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLAIMS_PATH = ROOT / "src" / "servebook" / "data" / "vllm_claims.toml"

FLAG_RE = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
METRIC_RE = re.compile(r"vllm:[a-z][a-z0-9_]*")
#: Prometheus adds these to a metric's registered name when it exposes it.
EXPOSITION_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def load_claims() -> dict:
    return tomllib.loads(CLAIMS_PATH.read_text())


def book_sources(root: Path = ROOT) -> list[Path]:
    """Every page, notebook and lab the book publishes."""
    files = sorted((root / "book").glob("*.md")) + sorted((root / "notebooks").glob("*.md"))
    files += sorted(p for p in (root / "labs").rglob("*.md") if "results" not in p.parts)
    return files


def names_in(text: str) -> tuple[list[tuple[int, str, str]], list[tuple[int, str]]]:
    """(flags as (line number, flag, line), metrics as (line number, metric)) named in ``text``."""
    flags, metrics = [], []
    for number, line in enumerate(text.splitlines(), 1):
        flags += [(number, m, line) for m in FLAG_RE.findall(line)]
        metrics += [(number, m) for m in METRIC_RE.findall(line)]
    return flags, metrics


def metric_base(name: str, known: set[str]) -> str:
    """The registered name behind an exposed one (``vllm:num_preemptions_total`` -> registered)."""
    if name in known:
        return name
    for suffix in EXPOSITION_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in known:
            return name[: -len(suffix)]
    return name


def servebook_flags() -> set[str]:
    """Every option string of every ``servebook`` sub-command."""
    from servebook.cli import build_parser

    def walk(parser) -> set[str]:
        found = {s for s in parser._option_string_actions if s.startswith("--")}
        for action in parser._actions:
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):  # sub-commands, at any depth (servebook drills show ...)
                for sub in choices.values():
                    found |= walk(sub)
        return found

    return walk(build_parser())


def serve_commands(text: str) -> list[list[str]]:
    """argv (after ``vllm serve``) of every ``vllm serve`` command printed in a fenced block."""
    commands = []
    in_fence = False
    lines: list[str] = []
    for raw in text.splitlines():
        if raw.strip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            lines.append(raw)
        elif lines:
            lines.append("")
    joined = "\n".join(lines).replace("\\\n", " ")
    for line in joined.splitlines():
        s = line.strip().lstrip("$ ").strip()
        if s.startswith("vllm serve "):
            words = shlex.split(s, comments=True)
            commands.append(words[2:])
    return commands


def unknown_names(files: list[Path], claims: dict) -> list[str]:
    vllm_flags = {f["flag"] for f in claims.get("flag", [])}
    other = {f["flag"] for f in claims.get("other_flag", [])}
    metrics = {m["name"] for m in claims.get("metric", [])}
    ours = servebook_flags()
    problems = []
    for path in files:
        flags, found_metrics = names_in(path.read_text())
        rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for number, flag, line in flags:
            if flag in vllm_flags or flag in other:
                continue
            if "servebook" in line and flag in ours:
                continue
            problems.append(f"{rel}:{number}: {flag} is not in vllm_claims.toml")
        for number, metric in found_metrics:
            if metric_base(metric, metrics) not in metrics:
                problems.append(f"{rel}:{number}: {metric} is not in vllm_claims.toml")
    return problems


def test_every_flag_and_metric_the_book_names_is_a_checked_claim():
    files = book_sources()
    assert any(p.parent.name == "book" for p in files)
    assert unknown_names(files, load_claims()) == []


def test_scanner_catches_an_unlisted_flag_and_metric(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Set `--max-num-seqs` and `--max-num-sequences` and watch `vllm:num_preemptions_total`\n"
        "and `vllm:num_preempted`.\n"
        "```bash\nservebook plan --config llama-3.1-8b --tp 2\n```\n"
        "and a vLLM line naming --tp on its own.\n"
    )
    problems = unknown_names([page], load_claims())
    assert problems == [
        f"{page}:1: --max-num-sequences is not in vllm_claims.toml",
        f"{page}:6: --tp is not in vllm_claims.toml",
        f"{page}:2: vllm:num_preempted is not in vllm_claims.toml",
    ]


def test_serve_commands_are_extracted_with_continuations():
    text = ("Prose vllm serve x --not-a-command\n```bash\n$ vllm serve meta-llama/Llama-3.1-8B \\\n"
            "  --max-model-len 8192 \\\n  --kv-cache-dtype fp8\n```\n")
    assert serve_commands(text) == [["meta-llama/Llama-3.1-8B", "--max-model-len", "8192", "--kv-cache-dtype", "fp8"]]


def test_claims_file_is_well_formed():
    claims = load_claims()
    import servebook

    assert claims["pinned"] == servebook.PINNED_VLLM
    for kind in ("flag", "default", "runtime_default", "metric", "log"):
        assert claims[kind], kind
    for f in claims["flag"]:
        assert f["flag"].startswith("--") and f.get("meaning") and f.get("section"), f
        assert f.get("exists", True) is False or "dest" in f, f
    ids = [f["flag"] for f in claims["flag"]]
    assert len(ids) == len(set(ids))
    for m in claims["metric"]:
        assert METRIC_RE.fullmatch(m["name"]), m


@pytest.mark.parametrize("path", book_sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_printed_serve_commands_use_only_claimed_flags(path):
    flags = {f["flag"] for f in load_claims()["flag"] if f.get("exists", True)}
    for argv in serve_commands(path.read_text()):
        used = [w.split("=", 1)[0] for w in argv if w.startswith("--")]
        assert set(used) <= flags, (path.name, sorted(set(used) - flags))


# ---- chapter pages: every glued number the prose quotes is computed by the page ---------------

GLUE_ROLE_RE = re.compile(r"\{glue(?::text|:md|:any)?\}`([^`:<]+)")
PAGES = sorted((ROOT / "book").glob("06-*.md"))


def glued_names_of(path: Path) -> tuple[set[str], set[str]]:
    """(names the prose quotes, names the page's code glues).

    The glued names come from the page's executed copy in this test run's book build when there is
    a current one (tests/built_book.py: scripts/test.sh built the book just before, from the same
    code and inputs); otherwise the page's code runs here, in-process.
    """
    import contextlib
    import os
    import sys
    import types

    import jupytext

    from built_book import executed_page, glued_names

    notebook = jupytext.read(path)
    prose = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    quoted = {m.strip() for m in GLUE_ROLE_RE.findall(prose)}
    executed = executed_page(path)
    if executed is not None:
        return quoted, glued_names(executed)
    glued: set[str] = set()
    fake = types.ModuleType("myst_nb")
    fake.glue = lambda name, value, display=True: glued.add(name)
    saved = sys.modules.get("myst_nb")
    sys.modules["myst_nb"] = fake
    cwd = os.getcwd()
    try:
        os.chdir(path.parent)
        namespace: dict = {"__name__": "__page__"}
        with contextlib.redirect_stdout(None):
            for cell in notebook.cells:
                if cell.cell_type == "code":
                    exec(compile(cell.source, f"{path.name}", "exec"), namespace)
    finally:
        os.chdir(cwd)
        if saved is not None:
            sys.modules["myst_nb"] = saved
        else:
            del sys.modules["myst_nb"]
    return quoted, glued


def test_there_are_chapter_pages():
    assert PAGES, "book/ holds no 06-*.md page"


@pytest.mark.parametrize("path", PAGES, ids=[p.stem for p in PAGES])
def test_page_computes_every_number_it_quotes(path):
    quoted, glued = glued_names_of(path)
    assert quoted, f"{path.name} quotes no glued value"
    assert quoted <= glued, f"{path.name} quotes names its code never glues: {sorted(quoted - glued)}"


def test_glue_check_catches_a_typo(tmp_path):
    page = tmp_path / "06-99-x.md"
    page.write_text("---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
                    "    format_version: 0.13\nkernelspec:\n  display_name: Python 3\n  language: python\n"
                    "  name: python3\n---\n\n# x\n\n```{code-cell} ipython3\nfrom myst_nb import glue\n"
                    "glue('a', 1.0, display=False)\n```\n\n{glue:text}`a:.1f` and {glue:text}`b:.1f`.\n")
    quoted, glued = glued_names_of(page)
    assert quoted == {"a", "b"} and glued == {"a"}


def test_index_names_the_gpus_the_labs_ran_on():
    """index.md: 'vLLM 0.26.0 on NVIDIA H200 GPUs (one GPU per lab, two for Lab 9 ...)'."""
    import json

    from servebook.records import results_path

    counts = {}
    for path in sorted(results_path("labs").glob("l*_gpu.json")):
        doc = json.loads(path.read_text())
        assert doc["gpu"]["name"] == "NVIDIA H200", f"index.md 'NVIDIA H200 GPUs': {path.name}"
        assert doc["vllm_version"] == "0.26.0", f"index.md 'vLLM 0.26.0': {path.name}"
        counts[path.name] = (doc["lab"], doc["gpu"]["count"])
    by_lab = {}
    for lab, count in counts.values():
        by_lab.setdefault(str(lab), set()).add(count)
    lab9 = [k for k in by_lab if k.startswith("l9_")]
    assert lab9 and all(by_lab[k] == {2} for k in lab9), f"index.md 'two for Lab 9': {by_lab}"
    assert all(v == {1} for k, v in by_lab.items() if k not in lab9), f"index.md 'one GPU per lab': {by_lab}"


def test_the_footer_names_the_pinned_and_the_gpu_labs_releases():
    """_config.yml's footer, on every page: 'Pinned engine: vLLM X. Recorded GPU results: vLLM Y on NVIDIA H200
    (one GPU; two for Lab 9).' X and Y are the library's releases (the GPU count is
    test_index_names_the_gpus_the_labs_ran_on's)."""
    import yaml

    from servebook.vllm_rules.release import GPU_LAB_VLLM, PINNED_VLLM

    footer = yaml.safe_load((ROOT / "_config.yml").read_text())["html"]["extra_footer"]
    found = re.fullmatch(r"Pinned engine: vLLM (\S+)\. Recorded GPU results: vLLM (\S+) on NVIDIA H200 "
                         r"\(one GPU; two for Lab 9\)\.", footer)
    assert found, f"_config.yml extra_footer changed its wording: {footer!r}"
    assert found.groups() == (PINNED_VLLM, GPU_LAB_VLLM), f"_config.yml extra_footer: {footer!r}"


def test_glued_names_read_from_an_executed_page_equal_the_in_process_run(tmp_path):
    """The two ways glued_names_of learns what a page glues agree: the executed copy's outputs
    (tests/built_book.py, what the book build stored) and the in-process run of the page's code."""
    from jupyter_cache.executors.utils import single_nb_execution
    from myst_nb.core.read import read_myst_markdown_notebook

    from built_book import glued_names

    page = tmp_path / "06-98-x.md"
    page.write_text("---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
                    "    format_version: 0.13\nkernelspec:\n  display_name: Python 3\n  language: python\n"
                    "  name: python3\n---\n\n# x\n\n```{code-cell} ipython3\nfrom myst_nb import glue\n"
                    "glue('shown', 1.0)\nglue('hidden', 2.0, display=False)\n```\n\n"
                    "{glue:text}`shown:.1f` and {glue:text}`hidden:.1f`.\n")
    notebook = read_myst_markdown_notebook(page.read_text(), add_source_map=True, path=page)
    result = single_nb_execution(notebook, cwd=str(tmp_path), allow_errors=False, timeout=120, meta_override=True)
    assert result.err is None, result.exc_string
    quoted, glued = glued_names_of(page)
    assert glued_names(notebook) == glued == quoted == {"shown", "hidden"}
