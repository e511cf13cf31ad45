#!/usr/bin/env bash
# Build the book into _build/html (no server). The one build step shared by scripts/book.sh,
# scripts/test.sh and .github/workflows/publish.yml:
#   .venv + requirements.txt, `npm ci` + vendored JavaScript (and Pyodide), the servebook wheel, then
#   jupyter-book build -W -n --keep-going .   (any warning or failing notebook fails the build)
# Notebooks run at build time with a cache (_build/.jupyter_cache). Cached outputs are stale when the
# library, the configuration, the requirements or the recorded GPU data (labs/results) change, so a stamp of those inputs is kept in
# _build/.servebook-inputs and the caches are cleared automatically when it differs. Pages without
# cached outputs are first run a few at a time (scripts/prerun_book.py; BOOK_JOBS, default: the cores).
# CLEAN=1 scripts/build-book.sh   removes the whole _build first.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$ROOT"

clear_stale_cache() {
  local stamp=_build/.servebook-inputs now
  now=$(inputs_stamp)
  if [ "${CLEAN:-0}" = 1 ]; then
    say "CLEAN=1: removing _build"
    rm -rf _build
  elif [ -d _build ] && [ ! -f "$stamp" ]; then
    say "_build has no input stamp (made by another tool?): clearing its caches to be safe"
    rm -rf _build/.jupyter_cache _build/.doctrees _build/html _build/jupyter_execute
  elif [ -f "$stamp" ] && [ "$(cat "$stamp")" != "$now" ]; then
    local changed
    # (diff exits 1 when the stamps differ: under pipefail and set -e that would end the script here)
    changed=$( { diff <(echo "$now") "$stamp" || true; } | awk '/^</ {print $2}' | paste -sd, -)
    say "build cache is stale (changed since the last build: ${changed:-unknown}); clearing _build/.jupyter_cache, _build/.doctrees and _build/html"
    say "(to clear everything yourself: rm -rf _build, or CLEAN=1 bash scripts/build-book.sh)"
    rm -rf _build/.jupyter_cache _build/.doctrees _build/html _build/jupyter_execute
  fi
  mkdir -p _build
  echo "$now" > "$stamp"
}

# The servebook wheel the "Run live" calculators install in the browser (pure Python, py3-none-any),
# next to the vendored Pyodide: vendor/site/_vendor/live/ (published at _build/html/_vendor/live/),
# with manifest.json naming it for servebook-live.js. Built from a copy of the sources, so the
# checkout gets no build/ or egg-info folder; no network (the venv's setuptools, no isolation).
build_live_wheel() {
  local out="$ROOT/vendor/site/_vendor/live" tmp
  tmp=$(mktemp -d)
  cp "$ROOT/pyproject.toml" "$ROOT/README.md" "$tmp/"
  (cd "$ROOT" && tar --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' -cf - src) | (cd "$tmp" && tar -xf -)
  "$VENV/bin/python" -m pip wheel --no-deps --no-build-isolation --no-index -q -w "$tmp/dist" "$tmp" \
    || { rm -rf "$tmp"; die "could not build the servebook wheel for the Run-live calculators (see above)"; }
  mkdir -p "$out"
  rm -f "$out"/servebook-*.whl
  local wheel; wheel=$(cd "$tmp/dist" && ls servebook-*-py3-none-any.whl)
  cp "$tmp/dist/$wheel" "$out/"
  printf '{"wheel": "%s"}\n' "$wheel" > "$out/manifest.json"
  rm -rf "$tmp"
  say "Run-live wheel: _vendor/live/$wheel ($(du -k "$out/$wheel" | cut -f1) KB)"
}

build() {
  clear_stale_cache
  build_live_wheel
  local log=_build/build.log rc=0
  # Run the pages that have no cached outputs a few at a time first (scripts/prerun_book.py; one
  # kernel per core): the build below then reads them from the cache instead of running them one by
  # one. A page that fails there is left to the build, which runs it again and reports it.
  PATH="$VENV/bin:$PATH" "$VENV/bin/python" "$ROOT/scripts/prerun_book.py" --jobs "${BOOK_JOBS:-$(nproc)}" \
    || say "prerun_book.py failed (see above); the build runs every page itself"
  # The kernel ("python3") must be this venv's Python: put it first on PATH.
  PATH="$VENV/bin:$PATH" "$VENV/bin/jupyter-book" build -W -n --keep-going . 2>&1 | tee "$log" || rc=$?
  if [ $rc -ne 0 ]; then
    echo >&2
    echo "error: the book did not build cleanly (exit $rc). Warnings and errors (full log: $log):" >&2
    grep -E "WARNING|ERROR|Error|Traceback" "$log" | head -40 >&2 || true
    if grep -qE "sqlite3\.|site-packages/jupyter_cache/|CachingError|database is locked|no such table" "$log"; then
      echo "hint: the notebook cache looks broken; clear it with: rm -rf _build/.jupyter_cache (or CLEAN=1 bash scripts/build-book.sh)" >&2
    fi
    echo "hint: a failing notebook prints its traceback above and in _build/html/reports/; run it alone with: .venv/bin/python -m pytest notebooks/<name>.md" >&2
    return $rc
  fi
  write_root_redirect
  say "book built: $ROOT/_build/html/index.html"
}

# jupyter-book's root index.html is a bare meta refresh: without an icon link, Chromium may ask the
# server for /favicon.ico (a 404 and a console error) before it follows the redirect.
write_root_redirect() {
  cat > _build/html/index.html <<'HTML'
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Serving with vLLM</title>
<link rel="icon" href="_static/favicon.svg" type="image/svg+xml">
<meta http-equiv="Refresh" content="0; url=book/index.html">
</head>
<body><p><a href="book/index.html">Serving with vLLM</a></p></body>
</html>
HTML
}

if [ "${SERVEBOOK_NESTED:-0}" = 1 ]; then
  # Called by scripts/test.sh, which has already made .venv and node_modules and times the build.
  vendor_js
  build
else
  stage "python env (.venv)" ensure_venv
  stage "vendored JavaScript" ensure_js
  stage "build book" build
  print_stage_times
fi
