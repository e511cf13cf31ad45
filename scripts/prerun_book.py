"""Execute the book's notebooks several at a time into the build's cache, before ``jupyter-book build``.

``jupyter-book build`` (myst-nb, ``execute_notebooks: cache``) runs each page that has no cached
outputs, one after the other: on a 2-core machine one core waits while a page's kernel computes.
This script runs the same pages in ``--jobs`` worker processes and stores each error-free run in
``_build/.jupyter_cache`` the way myst-nb stores its own (jupyter-cache's bundle, keyed by the hash
of the code cells and kernelspec). The build that follows then finds them in the cache ("Using
cached notebook") and renders them; it still runs, and reports, any page this script did not
store. Nothing is decided here that the build does not check itself:

* pages: every document of ``_toc.yml`` that myst-nb would execute: a MyST notebook (jupytext
  header), not matching ``execute.exclude_patterns`` of ``_config.yml``, and not set to another
  ``mystnb: execution_mode`` in its header (the GPU labs: "off");
* execution: myst-nb's own call (``jupyter_cache.executors.utils.single_nb_execution``) in the
  page's folder, with ``execute.timeout`` and ``execute.allow_errors`` of ``_config.yml``;
* a page that raises is not stored: the build runs it again and fails with its traceback.

Run by scripts/build-book.sh with the book's Python first on PATH (the ``python3`` kernel).
"""
from __future__ import annotations

import argparse
import multiprocessing
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path, PurePosixPath

import yaml

ROOT = Path(__file__).resolve().parents[1]


def book_notebooks(root: Path, config: dict) -> list[Path]:
    """The pages of the table of contents that myst-nb executes in cache mode (see the module docstring)."""
    from myst_nb.core.read import is_myst_markdown_notebook
    from sphinx_external_toc.parsing import parse_toc_yaml

    execute = config.get("execute", {})
    if execute.get("execute_notebooks", "cache") != "cache":
        return []
    excluded = execute.get("exclude_patterns", [])
    pages = []
    for docname in parse_toc_yaml(root / "_toc.yml"):
        path = root / f"{docname}.md"
        if not path.is_file():
            continue
        text = path.read_text()
        if not is_myst_markdown_notebook(text):
            continue
        if any(PurePosixPath(path.as_posix()).match(p) for p in excluded):
            continue
        if (read_page(path).metadata.get("mystnb") or {}).get("execution_mode", "cache") != "cache":
            continue
        pages.append(path)
    return pages


def read_page(path: Path):
    """The page as myst-nb's reader gives it to the build (same cells, hence the same cache key)."""
    from myst_nb.core.read import read_myst_markdown_notebook

    return read_myst_markdown_notebook(path.read_text(), add_source_map=True, path=path)


class PageTimeout(Exception):
    """A page ran longer than ``--page-timeout`` here (the build then runs it itself)."""


def _page_alarm(signum, frame):
    raise PageTimeout


def execute_page(path: Path, timeout: int, allow_errors: bool, page_timeout: int):
    """Worker: run one page in its folder; (executed notebook or None, seconds, error text).

    A page still running after ``page_timeout`` seconds is given up (its kernel killed) and left to
    the build: one prerun here once sat 300 s after the last cell of a 3-second page.
    """
    import psutil
    from jupyter_cache.executors.utils import single_nb_execution

    notebook = read_page(path)
    signal.signal(signal.SIGALRM, _page_alarm)
    signal.alarm(page_timeout)
    try:
        result = single_nb_execution(notebook, cwd=str(path.parent), allow_errors=allow_errors, timeout=timeout,
                                     meta_override=True)
    except PageTimeout:
        for child in psutil.Process().children(recursive=True):   # the page's kernel
            child.kill()
        return None, float(page_timeout), f"still running after {page_timeout} s"
    finally:
        signal.alarm(0)
    if result.err is not None:
        return None, result.time, f"{type(result.err).__name__}: {str(result.err)[-500:]}"
    return notebook, result.time, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="pages run at once (default 2)")
    parser.add_argument("--page-timeout", type=int, default=180,
                        help="seconds after which a page is given up and left to the build (default 180)")
    parser.add_argument("--cache", default=str(ROOT / "_build" / ".jupyter_cache"), help="jupyter-cache folder")
    args = parser.parse_args(argv)

    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    execute = config.get("execute", {})
    timeout, allow_errors = int(execute.get("timeout", 30)), bool(execute.get("allow_errors", False))
    cache = get_cache(args.cache)
    todo = []
    for path in book_notebooks(ROOT, config):
        try:
            cache.match_cache_notebook(read_page(path))
        except KeyError:
            todo.append(path)
    # Longest first (source size as the guess), so that no long page starts last.
    todo.sort(key=lambda p: p.stat().st_size, reverse=True)
    print(f"prerun-book: {len(todo)} page(s) to run, {args.jobs} at a time", flush=True)
    t0, failed = time.monotonic(), 0
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(execute_page, path, timeout, allow_errors, args.page_timeout): path for path in todo}
        for future in as_completed(futures):
            path = futures[future]
            rel = path.relative_to(ROOT)
            try:
                notebook, seconds, error = future.result()
            except Exception as exc:  # noqa: BLE001  (a worker that died: the build runs the page itself)
                notebook, seconds, error = None, 0.0, f"{type(exc).__name__}: {exc}"
            if notebook is None:
                failed += 1
                print(f"prerun-book: {rel} did not run cleanly ({error}); the build runs it again and reports it",
                      flush=True)
                continue
            cache.cache_notebook_bundle(CacheBundleIn(notebook, str(path), data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            print(f"prerun-book: {rel} ran in {seconds:.1f} s", flush=True)
    print(f"prerun-book: done in {time.monotonic() - t0:.0f} s ({failed} left to the build)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
