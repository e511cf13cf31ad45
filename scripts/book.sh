#!/usr/bin/env bash
# Build the book and serve it on http://127.0.0.1:${PORT:-8000} (Ctrl-C stops the server).
# On a fresh machine this makes .venv, installs requirements.txt, runs `npm ci` for the vendored
# JavaScript and builds with `jupyter-book build -W -n --keep-going` (scripts/build-book.sh).
#   PORT=8001 bash scripts/book.sh     serve on another port
#   CLEAN=1 bash scripts/book.sh       rebuild from scratch (drops the notebook cache)
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$ROOT"
PORT=${PORT:-8000}

# Who listens on 127.0.0.1:$PORT? Prints "free", or the PID(s) (or "unknown") when it is taken.
port_owner() {
  python3 - "$PORT" <<'PY'
import errno, os, socket, sys
port = int(sys.argv[1])
probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    probe.bind(("127.0.0.1", port))
    print("free")
    sys.exit(0)
except OSError as exc:
    if exc.errno != errno.EADDRINUSE:
        raise
finally:
    probe.close()
# Taken: find the socket inode in /proc/net/tcp{,6}, then the process holding it.
inodes = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        lines = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for line in lines:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
            inodes.add(fields[9])
pids = set()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:[") and target[8:-1] in inodes:
                pids.add(pid)
    except OSError:
        continue
print(",".join(sorted(pids, key=int)) or "unknown")
PY
}

check_port() {
  local owner
  owner=$(port_owner) || die "could not check port $PORT"
  if [ "$owner" != free ]; then
    echo "error: port $PORT is in use by PID $owner; set PORT=$((PORT + 1)) (e.g. PORT=$((PORT + 1)) bash scripts/book.sh) or stop that process" >&2
    exit 1
  fi
}

check_port                                   # fail before a long build, not after it
bash "$ROOT/scripts/build-book.sh"
check_port                                   # something may have taken it meanwhile
say "serving $ROOT/_build/html on http://127.0.0.1:$PORT/ (Ctrl-C to stop)"
# Python's http.server, with the two types the "Run live" calculators need set explicitly (its
# defaults come from the machine's /etc/mime.types, which may lack them): Pyodide's .wasm must be
# application/wasm (WebAssembly streaming compilation refuses any other type) and its .mjs modules
# a JavaScript type. GitHub Pages serves .wasm as application/wasm and .mjs as JavaScript too.
exec "$VENV/bin/python" -c '
import functools, http.server, sys
class Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".wasm": "application/wasm", ".mjs": "text/javascript"}
handler = functools.partial(Handler, directory=sys.argv[2])
http.server.test(HandlerClass=handler, ServerClass=http.server.ThreadingHTTPServer, port=int(sys.argv[1]), bind="127.0.0.1")
' "$PORT" "$ROOT/_build/html"
