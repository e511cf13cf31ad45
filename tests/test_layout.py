"""The library's import rule and public face.

- The CLI (``servebook.commands``, ``servebook.cli``) imports the library; no other module imports it.
- Pages and notebooks speak to the public face (``servebook`` and its library modules), never the CLI.
- Every name ``servebook.__all__`` lists is importable from ``servebook``.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "servebook"
CLI_MODULES = {SRC / "cli.py", SRC / "__main__.py"}


def _imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in ``path`` names, at any depth (lazy ones too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _library_files() -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py"))
            if "commands" not in p.relative_to(SRC).parts and p not in CLI_MODULES]


@pytest.mark.parametrize("path", _library_files(), ids=lambda p: str(p.relative_to(SRC)))
def test_library_never_imports_the_cli(path):
    bad = sorted(m for m in _imported_modules(path) if m == "servebook.commands" or m.startswith("servebook.commands."))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}; move what it needs into the library"


def test_the_import_check_sees_lazy_imports(tmp_path):
    """The checker above catches an import inside a function (how the old code reached make_plan)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from servebook.commands.plan import make_plan\n    return make_plan\n")
    assert "servebook.commands.plan" in _imported_modules(f)


_PAGE_IMPORT = re.compile(r"^\s*(?:from|import)\s+servebook\.commands\b", re.MULTILINE)
PAGES = sorted((ROOT / "book").glob("*.md")) + sorted((ROOT / "notebooks").glob("*.md"))


def test_pages_exist():
    assert len(PAGES) > 10


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_and_notebooks_do_not_import_the_cli(page):
    hits = _PAGE_IMPORT.findall(page.read_text())
    assert not hits, f"{page.relative_to(ROOT)} imports servebook.commands; import from servebook instead"


def test_page_import_pattern_matches_an_import():
    assert _PAGE_IMPORT.search("x = 1\nfrom servebook.commands.plan import make_plan\n")
    assert not _PAGE_IMPORT.search("from servebook import make_plan\n")


def test_public_names_resolve():
    import servebook

    missing = [n for n in servebook.__all__ if not hasattr(servebook, n)]
    assert not missing
    from servebook.plan import make_plan

    assert servebook.make_plan is make_plan


# ---- the repository layout: only servebook.records knows where recorded results are --------------------

_LAYOUT_NAMES = {"labs", "results", "tests", "fixtures", "src"}


def _layout_uses(path: Path) -> list[str]:
    """Path-building with a layout folder name (``x / "labs"``) or climbing out of the package (``.parents[2]``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and isinstance(side.value, str) \
                        and side.value.split("/")[0] in _LAYOUT_NAMES:
                    found.append(f"line {node.lineno}: / {side.value!r}")
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "parents":
            found.append(f"line {node.lineno}: .parents[...]")
    return found


@pytest.mark.parametrize("path", [p for p in sorted(SRC.rglob("*.py")) if p.name != "records.py"],
                         ids=lambda p: str(p.relative_to(SRC)))
def test_only_records_names_the_repository_layout(path):
    assert not _layout_uses(path), f"{path.relative_to(ROOT)}: {_layout_uses(path)}; ask servebook.records"


def test_the_layout_check_sees_a_repo_root(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('from pathlib import Path\nROOT = Path(__file__).parents[2]\nR = ROOT / "labs" / "results"\n')
    uses = _layout_uses(f)
    assert any("parents" in u for u in uses) and any("labs" in u for u in uses)


def test_records_finds_results_explicitly_by_env_upward_and_falls_back(tmp_path, monkeypatch):
    from servebook import records

    checkout = tmp_path / "book"
    (checkout / "labs" / "results").mkdir(parents=True)
    deep = checkout / "book" / "chapter"
    deep.mkdir(parents=True)
    monkeypatch.delenv(records.RESULTS_ENV, raising=False)
    monkeypatch.chdir(deep)
    assert records.results_dir() == (checkout / "labs" / "results").resolve()
    assert records.checkout_root() == checkout.resolve()
    assert records.results_path("labs", "x.json") == (checkout / "labs" / "results" / "labs" / "x.json").resolve()
    assert records.results_dir(tmp_path / "given") == tmp_path / "given"
    monkeypatch.setenv(records.RESULTS_ENV, str(tmp_path / "elsewhere"))
    assert records.results_dir() == tmp_path / "elsewhere"
