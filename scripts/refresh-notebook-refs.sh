#!/usr/bin/env bash
# Regenerate the reference outputs nbval compares the notebooks' checked cells with
# (tests/notebook_refs/<name>.ipynb, cells tagged `nbval-check-output`). Run it after changing a
# checked cell or a number it prints on purpose, read the diff (`git diff tests/notebook_refs`:
# every changed line is a changed claim of the book) and commit it. Uses .venv as made by
# scripts/test.sh or scripts/book.sh.
#   bash scripts/refresh-notebook-refs.sh                 # every notebook
#   bash scripts/refresh-notebook-refs.sh kv_per_token    # one
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$ROOT"
ensure_venv
"$VENV/bin/python" "$ROOT/scripts/refresh_notebook_refs.py" "$@"
