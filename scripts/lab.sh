#!/usr/bin/env bash
# Open the chapter's notebooks in JupyterLab, widgets live: makes or reuses .venv (requirements.txt,
# which holds JupyterLab, jupytext and ipywidgets; nothing is installed when it is up to date), then
# serves the repository on 127.0.0.1 with notebooks/ open. A MyST-markdown notebook (notebooks/*.md,
# labs/*.md) opens as a notebook on a double click: scripts/lab-settings/overrides.json makes
# jupytext's "Jupytext Notebook" the default viewer of markdown files; JupyterLab reads it as its
# app settings folder, so nothing is written to your home folder (Open With -> Editor still shows
# the text). JupyterLab prints the URL with its login token. Stop it with Ctrl-C.
#   bash scripts/lab.sh                        # port 8888, or the next free one
#   bash scripts/lab.sh notebooks/kv_per_token.md   # open one notebook (a path from the repository root)
#   PORT=8890 bash scripts/lab.sh --no-browser # another port; extra arguments go to `jupyter lab`
# SERVEBOOK_LAB_NO_INSTALL=1 uses .venv as it is (tests/test_lab.py does, so a test never installs).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$ROOT"
if [ "${SERVEBOOK_LAB_NO_INSTALL:-0}" != 1 ]; then
  ensure_venv
fi
[ -x "$VENV/bin/jupyter-lab" ] || die "$VENV has no JupyterLab: run without SERVEBOOK_LAB_NO_INSTALL=1 (it installs requirements.txt)"
open_path=notebooks
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  open_path=${1%/}; shift
  [ -e "$ROOT/$open_path" ] || die "no such file or folder: $open_path (give a path from the repository root, e.g. notebooks/kv_per_token.md)"
fi
as_root=(); [ "$(id -u)" != 0 ] || as_root=(--allow-root)   # a container's root user: JupyterLab refuses it otherwise
say "JupyterLab on http://127.0.0.1:${PORT:-8888} (the URL with the token follows), $open_path open"
exec "$VENV/bin/jupyter-lab" --ServerApp.ip=127.0.0.1 --ServerApp.port="${PORT:-8888}" \
  --ServerApp.root_dir="$ROOT" --LabApp.default_url="/lab/tree/$open_path" \
  --LabApp.app_settings_dir="$ROOT/scripts/lab-settings" ${as_root[@]+"${as_root[@]}"} "$@"
