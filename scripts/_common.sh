# Shared helpers for scripts/book.sh, scripts/build-book.sh and scripts/test.sh (sourced, not run).
# Each helper is idempotent: a stamp file holding a hash of its inputs skips work already done.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
set -o pipefail   # a failing install inside a filtered pipeline must count as failing
VENV="$ROOT/.venv"
export PIP_DISABLE_PIP_VERSION_CHECK=1

die() { echo "error: $*" >&2; exit 1; }
say() { echo "==> $*"; }

# stage NAME COMMAND...: run a command, print how long it took, remember it for the summary.
STAGE_TIMES=()
stage() {
  local name=$1; shift
  local t0=$SECONDS rc=0
  say "stage '$name'"
  "$@" || rc=$?
  local dt=$((SECONDS - t0))
  STAGE_TIMES+=("$(printf '%-22s %4d s  %s' "$name" "$dt" "$([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)")")")
  say "stage '$name' took ${dt} s (exit $rc)"
  return $rc
}
print_stage_times() {
  echo "---- stage times ----"
  local line; for line in "${STAGE_TIMES[@]}"; do echo "$line"; done
}

hash_files() { (cd "$ROOT" && sha256sum "$@" 2>/dev/null | sha256sum | cut -c1-16); }

# inputs_stamp: what the book build's cached notebook outputs depend on (scripts/build-book.sh keeps it in
# _build/.servebook-inputs and clears the caches when it differs; tests/built_book.py compares the two
# before reading a page's executed outputs from _build/.jupyter_cache).
inputs_stamp() {
  (cd "$ROOT"
  # One line per input group: a change in any group makes earlier notebook outputs untrustworthy.
  echo "config    $(hash_files _config.yml _toc.yml $(ls book/_ext/*.py 2>/dev/null))"
  echo "python    $(hash_files requirements.txt pyproject.toml)"
  echo "js        $(hash_files package-lock.json)"
  echo "library   $(hash_files $(find src/servebook -type f ! -path '*/__pycache__/*' ! -name '*.pyc' | sort))"
  # Pages glue numbers from the recorded GPU data: a new or changed result file must re-run them.
  echo "recorded  $(hash_files $(find labs/results -type f -name '*.json' | sort))")
}

# venv_install VENV ARGS...: install packages into VENV with uv (resolves and downloads in
# parallel: about 10x faster than pip on a 2-core machine), falling back to pip if uv cannot be had.
# Both write the .pyc files at install time (pip does by default).
# uv itself comes from PyPI into VENV. Where this machine keeps a local CPU build of torch
# (/opt/wheels), uv is told about it (pip finds it through pip.conf; uv reads no pip.conf).
venv_install() {
  local venv=$1; shift
  local pipq=("$venv/bin/pip" install -q)
  if [ -x "$venv/bin/uv" ] || "${pipq[@]}" uv 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; then
    if [ -x "$venv/bin/uv" ]; then
      local links=(); [ -d /opt/wheels ] && links=(--find-links /opt/wheels)
      # --compile-bytecode: write every installed module's .pyc now. Where PYTHONDONTWRITEBYTECODE
      # is set (this CI image sets it) no process may write them later, so without this each
      # process compiles vLLM, torch and transformers from source again (an `import vllm` takes
      # ~22 s instead of ~9 s on 2 cores, and the engine tests start dozens of such processes).
      "$venv/bin/uv" pip install -q --compile-bytecode --python "$venv/bin/python" "${links[@]}" "$@" && return 0
      say "uv could not install $*; trying pip"
    fi
  fi
  # (grep drops one machine-specific pip warning about index folders that do not exist)
  "${pipq[@]}" "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

# .venv with requirements.txt (book + library + tests); re-installs when requirements change.
ensure_venv() {
  command -v python3 >/dev/null || die "python3 not found: install Python 3.10-3.12 (Debian: apt-get install -y python3 python3-venv)"
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed: install the venv module (Debian: apt-get install -y python3-venv)"
  fi
  local want; want=$(hash_files requirements.txt pyproject.toml)
  local stamp="$VENV/.servebook-requirements"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import servebook, myst_nb" 2>/dev/null; then
    say "$VENV is up to date with requirements.txt"
    return 0
  fi
  say "installing requirements.txt into $VENV"
  venv_install "$VENV" -r "$ROOT/requirements.txt" || die "installing requirements.txt failed (see above)"
  echo "$want" > "$stamp"
}

# node_modules from package-lock.json (`npm ci`), then the vendored copy the book serves.
ensure_js() {
  command -v node >/dev/null && command -v npm >/dev/null || die "node/npm missing: the book vendors MathJax, require.js, the ipywidgets HTML manager and Pyodide from the npm registry. Install Node.js 18+ with npm (Debian: apt-get install -y nodejs npm)."
  local want; want=$(hash_files package.json package-lock.json)
  local stamp="$ROOT/node_modules/.servebook-lock"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    say "node_modules is up to date with package-lock.json"
  else
    say "npm ci (vendored JavaScript)"
    (cd "$ROOT" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) || die "npm ci failed (see above); package-lock.json must match package.json (run 'npm install' and commit the lock)"
    echo "$want" > "$stamp"
  fi
  vendor_js
}

# Copy the files the pages load into vendor/site/_vendor/ (published at _build/html/_vendor/).
# (scripts/build-book.sh adds the servebook wheel to _vendor/live/ after this.)
vendor_js() {
  local nm="$ROOT/node_modules" out="$ROOT/vendor/site/_vendor"
  rm -rf "$out" && mkdir -p "$out/mathjax" "$out/requirejs" "$out/html-manager" "$out/widgets"
  cp -r "$nm/mathjax/es5" "$out/mathjax/es5"
  cp "$nm/mathjax/LICENSE" "$out/mathjax/"
  cp "$nm/requirejs/require.js" "$nm/requirejs/package.json" "$out/requirejs/"
  find "$nm/@jupyter-widgets/html-manager/dist" -maxdepth 1 -type f ! -name '*.map' -exec cp {} "$out/html-manager/" \;
  cp "$nm/@jupyter-widgets/html-manager/package.json" "$out/html-manager/"
  cp "$ROOT/book/_ext/widgets-setup.js" "$out/widgets-setup.js"
  echo "Third-party widget modules would be looked up here; the book uses only ipywidgets' built-in ones (bundled in html-manager/embed-amd.js)." > "$out/widgets/README.txt"
  # Pyodide (the "Run live" calculators, book/_ext/live_calculator.py): the runtime, its WebAssembly
  # and the standard library; it carries no package wheels and the pages never load any from elsewhere.
  mkdir -p "$out/pyodide" "$out/live"
  for f in pyodide.mjs pyodide.asm.mjs pyodide.asm.wasm python_stdlib.zip pyodide-lock.json package.json; do
    cp "$nm/pyodide/$f" "$out/pyodide/" || die "node_modules/pyodide/$f is missing; run npm ci (package.json pins pyodide)"
  done
  cp "$ROOT/book/_ext/live/servebook-live.js" "$ROOT/book/_ext/live/servebook-live.css" "$out/live/"
  for f in mathjax/es5/tex-chtml.js requirejs/require.js html-manager/embed-amd.js pyodide/pyodide.asm.wasm live/servebook-live.js; do
    [ -s "$out/$f" ] || die "vendored file $out/$f is missing after npm ci; check package.json"
  done
}
