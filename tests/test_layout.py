"""The library's import rule and public face.

- The CLI (``servebook.commands``, ``servebook.cli``) imports the library; no other module imports it.
- Pages, notebooks and lab pages speak to the public face (``servebook`` and its library modules), never the
  CLI, and build no repository path: recorded results come from ``servebook.records``, shipped data from
  ``servebook.shipped`` (checked on their code cells).
- No notebook code line is wider than the page (88 characters).
- No cell a notebook's reader sees holds an ``assert`` (checks live in tests/test_notebook_claims.py).
- Only ``servebook.records`` names the repository layout inside the library.
- Every name ``servebook.__all__`` lists is importable from ``servebook``, and pages import it from there.
- Layers: every module of the library imports only modules of lower layers (or of its own group); no
  module imports the package face ``servebook`` but the CLI (:data:`LAYERS`).
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

import servebook

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


# ---- layers: a module imports only the layers below its own ------------------------------------------
#: The library's layers, lowest first. A layer holds one or more groups, each named by module prefixes
#: (a prefix names the module and everything below it; the longest prefix wins). A module may import a
#: module of a lower layer or of its own group: never one of a higher layer, nor of another group of its
#: own layer (peers stay independent: a lab's analysis never imports the end-to-end validation). The
#: package face (``servebook/__init__``) sits under the CLI alone: no module of the library imports it.
LAYERS: list[dict[str, tuple[str, ...]]] = [
    {"foundations": ("servebook.errors", "servebook.model_spec", "servebook._version", "servebook.vllm_rules",
                     "servebook.reductions", "servebook.hardware", "servebook.shipped", "servebook.provenance",
                     "servebook.cpu_features", "servebook.figure_style", "servebook.quant_schemes",
                     "servebook.rotary_cache")},
    {"model inputs": ("servebook.hf_config", "servebook.kv_cache", "servebook.memory", "servebook.memory_fit",
                      "servebook.startup_log", "servebook.records", "servebook.engine_env", "servebook.tiny_model",
                      "servebook.lora")},
    # the deployment every model prices (issue 35): below them all
    {"plan": ("servebook.plan",)},
    {"perf": ("servebook.perf",), "batch": ("servebook.batch",)},
    {"simulator": ("servebook.simulator",), "draft": ("servebook.draft",)},
    # the checks every front door (commands, live pages) runs before any work
    {"validation": ("servebook.validation",)},
    {"lab harness": ("servebook.lab", "servebook.lab.errors", "servebook.lab.harness")},
    {"lab recordings": ("servebook.lab.recordings",)},
    {"lab analyses": ("servebook.lab.analyses",), "lab e2e": ("servebook.lab.e2e",)},
    {"figures": ("servebook.figures", "servebook.diagrams"), "drills": ("servebook.drills",), "live": ("servebook.live",)},
    {"package face": ("servebook",)},
    {"CLI": ("servebook.commands", "servebook.cli", "servebook.__main__")},
]
#: Packages whose ``__init__`` is placed by its own name only (their submodules each have a group).
_EXACT = {"servebook", "servebook.lab"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _place(module: str) -> tuple[int, str] | None:
    """(layer index, group) of a module name (or of ``module.attribute``), None when no group names it."""
    best = None
    for layer, groups in enumerate(LAYERS):
        for group, prefixes in groups.items():
            for prefix in prefixes:
                hit = module == prefix or (prefix not in _EXACT and module.startswith(prefix + "."))
                if hit and (best is None or len(prefix) > best[0]):
                    best = (len(prefix), layer, group)
    return None if best is None else best[1:]


def _layer_violations(module: str, imported: set[str]) -> list[str]:
    """Imports of ``module`` that reach a higher layer or a peer group: ``"name (layer group)"`` each."""
    layer, group = _place(module)
    found = []
    for name in sorted(imported):
        if name != "servebook" and not name.startswith("servebook."):
            continue
        # ``from servebook.x import y`` names servebook.x and servebook.x.y: judge the module itself
        target = _place(name)
        if target is None or target == (layer, group) or target[0] < layer:
            continue
        found.append(f"{name} ({target[1]})")
    return found


@functools.lru_cache(maxsize=1)
def _imports_by_module() -> dict[str, set[str]]:
    """Every library module (the CLI too) and the servebook modules it imports, at any depth.

    ``from servebook.x import y`` counts as an import of ``servebook.x`` only when ``y`` is not a module:
    its ``servebook.x.y`` name is kept only when that is a module of the package.
    """
    files = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}
    out = {}
    for module, path in files.items():
        names = set()
        for name in _imported_modules(path):
            parent = name.rsplit(".", 1)[0]
            if name in files or parent not in files or name == parent:
                names.add(name)
            else:
                names.add(parent)     # an attribute of a module: the module
        out[module] = names
    return out


def test_every_module_has_a_layer():
    unplaced = [m for m in _imports_by_module() if _place(m) is None]
    assert not unplaced, f"{unplaced}: place each new module in a group of LAYERS (tests/test_layout.py)"


@pytest.mark.parametrize("module", sorted(_imports_by_module()), ids=str)
def test_modules_import_only_lower_layers(module):
    found = _layer_violations(module, _imports_by_module()[module])
    layer, group = _place(module)
    assert not found, (f"{module} ({group}) imports {found}: a higher layer or a peer. Move the shared code down "
                       "(or have the caller pass what the lower module needs); see LAYERS in tests/test_layout.py")


def test_no_library_module_imports_the_package_face():
    """``from servebook import X`` inside the package runs the face, which imports the library: a circle."""
    cli = {m for m in _imports_by_module() if _place(m)[1] == "CLI"}
    found = sorted(m for m, names in _imports_by_module().items() if m not in cli and "servebook" in names)
    assert not found, f"{found} import the package face; import the module that holds the name"


@pytest.mark.parametrize("module, imports, bad", [
    ("servebook.lab.recordings.recorded", {"servebook.lab.analyses.lab3_preemption"}, True),   # generic knows a lab
    ("servebook.lab.analyses.lab3_preemption", {"servebook.figures"}, True),                    # lab -> figures
    ("servebook.plan", {"servebook"}, True),                                                    # the face
    ("servebook.perf.model", {"servebook.simulator.run"}, True),                                 # perf -> simulator
    ("servebook.lab.e2e.analysis", {"servebook.lab.analyses.lab9_parallel"}, True),             # peers
    ("servebook.lab.analyses.lab3_preemption", {"servebook.lab.recordings.recorded", "servebook.figure_style",
                                                "servebook.lab.analyses.lab3_preemption"}, False),
    ("servebook.figures", {"servebook.lab.analyses.lab5_chunked_prefill", "servebook.perf"}, False),
    ("servebook.commands.plan", {"servebook", "servebook.plan"}, False),
])
def test_the_layer_check_fails_an_upward_import(module, imports, bad):
    assert bool(_layer_violations(module, imports)) is bad


def test_the_layer_check_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from servebook.figures import page_axes\n    return page_axes\n")
    assert _layer_violations("servebook.lab.analyses.lab3_preemption", _imported_modules(f))


# ---- pages and notebooks: the public face, and no repository paths --------------------------------------
# A page runs in its own folder (book/, notebooks/, labs/) at build time; what it reads comes from the
# library: servebook.records for recorded lab results, servebook.shipped for the data the package ships.

#: The names the package face lists (``servebook.__all__``): pages import them from ``servebook``.
_PUBLIC_NAMES = frozenset(servebook.__all__)
PAGES = sorted((ROOT / "book").glob("*.md")) + sorted((ROOT / "notebooks").glob("*.md")) \
    + sorted((ROOT / "labs").glob("*.md"))
_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.S | re.M)
#: Path fragments of the repository layout a page may not spell out (ask records/shipped instead).
_PAGE_LAYOUT_STRINGS = ("labs/results", "tests/fixtures", "src/servebook")


def _code_cells(text: str) -> list[tuple[int, str]]:
    """(line of the cell's first source line in the page, source) for each ``{code-cell}`` block.

    Cell options (``:tags: ...`` lines, a ``---`` YAML header) and IPython magics or shell lines
    (``%...``, ``!...``) are blanked, keeping line numbers, so the rest parses as Python.
    """
    cells = []
    for m in _CELL.finditer(text):
        lines = m.group(1).split("\n")
        if lines and lines[0].strip() == "---":
            end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), 0)
            lines[:end + 1] = [""] * (end + 1)
        lines = ["" if ln.lstrip().startswith((":", "%", "!")) else ln for ln in lines]
        cells.append((text.count("\n", 0, m.start(1)) + 1, "\n".join(lines)))
    return cells


def _page_violations(text: str, name: str = "page") -> list[str]:
    """Imports of servebook.commands and hand-built repository paths in a page's code cells."""
    found = []
    for first, source in _code_cells(text):
        tree = ast.parse(source, name)
        where = lambda node: f"line {first + node.lineno - 1}"  # noqa: E731
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(n == "servebook.commands" or n.startswith("servebook.commands.") for n in names):
                    found.append(f"{where(node)}: imports servebook.commands (import from servebook)")
                if any(a.name == "REPO_ROOT" for a in node.names):
                    found.append(f"{where(node)}: imports REPO_ROOT (ask servebook.records)")
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("servebook."):
                    public = sorted(a.name for a in node.names if a.name in _PUBLIC_NAMES)
                    if public:
                        found.append(f"{where(node)}: imports {', '.join(public)} from {node.module} "
                                     "(a public name: import it from servebook)")
            elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "parents":
                found.append(f"{where(node)}: .parents[...] (a hand-made repository root)")
            elif isinstance(node, (ast.Name, ast.Attribute)) \
                    and (node.id if isinstance(node, ast.Name) else node.attr) == "REPO_ROOT":
                found.append(f"{where(node)}: REPO_ROOT (ask servebook.records)")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and any(s in node.value for s in _PAGE_LAYOUT_STRINGS):
                found.append(f"{where(node)}: path string {node.value!r}")
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                for side in (node.left, node.right):
                    if isinstance(side, ast.Constant) and isinstance(side.value, str) \
                            and side.value.split("/")[0] in _LAYOUT_NAMES:
                        found.append(f"{where(node)}: / {side.value!r}")
    return found


def test_pages_exist():
    assert len(PAGES) > 30


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_use_the_public_face_and_no_repository_paths(page):
    found = _page_violations(page.read_text(), page.name)
    assert not found, (f"{page.relative_to(ROOT)}: {found}; import from servebook, read recorded results "
                       "with servebook.records (read_json, results_path) and shipped data with servebook.shipped")


_FAKE_PAGE = """# A page

```python
ROOT = Path.cwd().parents[1]   # a plain block: not executed, not checked
```

```{code-cell} ipython3
:tags: [remove-cell]
%matplotlib inline
import json
from servebook import make_plan
from servebook.records import read_json
# a comment may name labs/results/step_timing/qwen3-32b.json
rec = read_json("step_timing", "qwen3-32b.json")
```
"""


@pytest.mark.parametrize("bad", [
    "from servebook.commands.plan import make_plan",
    "import servebook.commands.plan as p",
    "ROOT = Path.cwd().parents[1]",
    "ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / 'labs' / 'results').is_dir())",
    "from servebook.engine_env import REPO_ROOT",
    "x = json.loads((ROOT / 'labs/results/step_timing/qwen3-32b.json').read_text())",
    "fixtures = Path('..') / 'tests' / 'fixtures' / 'startup_logs'",
    "claims = Path('../src/servebook/data/vllm_claims.toml')",
    "def f():\n    from servebook.commands import plan",
    "from servebook.plan import make_plan",
    "from servebook.perf import decode_step, prefill_step",
    "from servebook.vllm_rules import PINNED_VLLM",
])
def test_the_page_check_fails_a_page_that_reads_the_repository(bad):
    """A clean page passes; the same page with one bad line in a code cell fails, on that line."""
    assert _page_violations(_FAKE_PAGE) == []
    page = _FAKE_PAGE.replace("rec = read_json", bad + "\nrec = read_json")
    found = _page_violations(page)
    bad_line = page.splitlines().index(bad.splitlines()[-1]) + 1
    assert found and all(f"line {bad_line}" in f or f"line {bad_line - 1}" in f for f in found), found



# ---- notebooks: no code line wider than the page -----------------------------------------------------
# The built notebook shows a code cell in a box about 88 characters wide; a longer line scrolls sideways.
NOTEBOOK_LINE_CHARS = 88
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.md"))


def _wide_code_lines(text: str, limit: int = NOTEBOOK_LINE_CHARS) -> list[str]:
    """``line N: K characters`` for each code-cell line of a page longer than ``limit`` characters."""
    found = []
    for first, source in _code_cells(text):
        for offset, line in enumerate(source.split("\n")):
            if len(line) > limit:
                found.append(f"line {first + offset}: {len(line)} characters")
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_code_lines_fit_the_page(notebook):
    found = _wide_code_lines(notebook.read_text())
    assert not found, (f"{notebook.relative_to(ROOT)}: code lines over {NOTEBOOK_LINE_CHARS} characters "
                       f"{found}; split the call over lines or name an intermediate value")


def test_the_width_check_names_the_wide_line():
    """A clean page passes; a code cell with one wide line fails on that line, a wide prose line does not."""
    assert _wide_code_lines(_FAKE_PAGE) == []
    wide = "x = " + "1 + " * 30 + "1"
    page = _FAKE_PAGE.replace("rec = read_json", wide + "\nrec = read_json") + "\n" + "prose " * 30 + "\n"
    line = page.splitlines().index(wide) + 1
    assert _wide_code_lines(page) == [f"line {line}: {len(wide)} characters"]



# ---- notebooks: checks of numbers live in tests/test_notebook_claims.py, not in the reader's cells ---

def _visible_asserts(text: str) -> list[str]:
    """``line N`` for each ``assert`` statement in a code cell the built page shows (not tagged
    ``remove-cell``)."""
    found = []
    for m in _CELL.finditer(text):
        if re.match(r":tags:.*remove-cell", m.group(1)):
            continue
        first = text.count("\n", 0, m.start(1)) + 1
        source = "\n".join("" if ln.lstrip().startswith((":", "%", "!")) else ln
                            for ln in m.group(1).split("\n"))
        found += [f"line {first + node.lineno - 1}" for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Assert)]
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_cells_the_reader_sees_hold_no_assert(notebook):
    found = _visible_asserts(notebook.read_text())
    assert not found, (f"{notebook.relative_to(ROOT)}: assert in a cell the reader sees {found}; "
                       "move the check to tests/test_notebook_claims.py (recompute the value there)")


def test_the_assert_check_sees_visible_asserts_only():
    page = _FAKE_PAGE.replace("rec = read_json", "assert rec\nrec = read_json")
    assert _visible_asserts(_FAKE_PAGE) == [] and _visible_asserts(page) == []  # a remove-cell
    shown = page.replace(":tags: [remove-cell]\n", "")
    assert _visible_asserts(shown) == [f"line {shown.splitlines().index('assert rec') + 1}"]


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


def test_read_json_reads_a_record_and_names_the_fix_when_it_is_missing(tmp_path, monkeypatch):
    from servebook import records

    (tmp_path / "step_timing").mkdir()
    (tmp_path / "step_timing" / "m.json").write_text('{"cases": [1, 2]}')
    monkeypatch.setenv(records.RESULTS_ENV, str(tmp_path))
    assert records.read_json("step_timing", "m.json") == {"cases": [1, 2]}
    with pytest.raises(FileNotFoundError, match=r"SERVEBOOK_RESULTS_DIR.*step_timing/absent\.json"):
        records.read_json("step_timing", "absent.json")


@pytest.mark.parametrize("folder", ["book", "notebooks", "labs"])
def test_a_page_running_in_its_folder_finds_this_checkouts_results(folder, monkeypatch):
    """The build runs each page in its own folder; records' upward search must land on this checkout."""
    from servebook import records

    monkeypatch.delenv(records.RESULTS_ENV, raising=False)
    monkeypatch.chdir(ROOT / folder)
    assert records.results_dir().resolve() == (ROOT / "labs" / "results").resolve()
    assert records.read_json("step_timing", "qwen3-32b.json")["cases"]
