"""Start a real ``vllm serve`` engine for a lab, and always tear it down.

:class:`VllmServer` is a context manager::

    with VllmServer(model, {"max_model_len": 2048}, env=profile.engine_env()) as server:
        server.startup          # parsed start-up log (servebook.startup_log.StartupLog)
        server.metrics()        # /metrics as {name: value}
        run_bench(server, ...)  # load with ``vllm bench serve``

The server runs in its own session and process group (``start_new_session``), bound to
127.0.0.1 on a free port, under the machine-wide engine lock. Leaving the ``with`` block —
normally, by an exception or by KeyboardInterrupt — sends SIGTERM to the whole group, then
SIGKILL to whatever is left after ``grace_s``; an ``atexit`` hook does the same for a
kernel that exits with servers still up. vLLM writes its log to stdout; the harness keeps
all of it (``server.log``).
"""
from __future__ import annotations

import atexit
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path

from servebook.engine_env import engine_lock, vllm_python
from servebook.lab.errors import EngineStartError, PortInUseError
from servebook.lab.harness.metrics import parse_metrics
from servebook.startup_log import StartupLog, parse_startup_log

HOST = "127.0.0.1"
_LIVE: set["VllmServer"] = set()
#: Seconds this process has waited for the machine-wide engine lock (other engines running).
LOCK_WAIT_S = [0.0]


@contextmanager
def timed_engine_lock():
    """:func:`servebook.engine_env.engine_lock`, adding the wait to :data:`LOCK_WAIT_S`."""
    t0 = time.monotonic()
    with engine_lock():
        LOCK_WAIT_S[0] += time.monotonic() - t0
        yield


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_owner(port: int) -> tuple[int | None, str | None]:
    """(PID, process name) of whatever listens on ``port``, when the OS tells us."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid is None:
                    return None, None
                try:
                    return conn.pid, psutil.Process(conn.pid).name()
                except psutil.Error:
                    return conn.pid, None
    except Exception:  # noqa: BLE001  (psutil missing or not allowed: owner unknown)
        pass
    return None, None


def check_port_free(port: int) -> None:
    """Raise :class:`PortInUseError` (naming the port and owner PID) unless ``port`` can be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
            return
        except OSError:
            pass
    pid, name = port_owner(port)
    who = f"PID {pid}" + (f" ({name})" if name else "") if pid else "another process (PID unknown)"
    raise PortInUseError(
        f"port {port} on {HOST} is in use by {who}; pass port=None to pick a free port, "
        f"or stop that process{f' (kill {pid})' if pid else ''}"
    )


def engine_args_to_cli(args: dict) -> list[str]:
    """``{"max_model_len": 2048, "enforce_eager": True}`` -> ``["--max-model-len", "2048", "--enforce-eager"]``.

    ``True`` is a bare flag, ``False``/``None`` leave the flag out, lists repeat the values, and a
    dict is passed as JSON (``--hf-overrides '{"global_head_dim": 512}'``, as vLLM parses it).
    """
    import json

    out: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        elif isinstance(value, dict):
            out += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            out += [flag, str(value)]
    return out


#: Engine error lines and what to change. First match wins.
_HINTS: tuple[tuple[str, str], ...] = (
    (r"out of memory|OutOfMemoryError|CUDA error: out of memory",
     "the GPU ran out of memory: lower --gpu-memory-utilization's competitors (other processes), "
     "--max-model-len or --max-num-seqs, or use a smaller model / more GPUs (--tensor-parallel-size)"),
    (r"No available memory for the cache blocks|Insufficient memory|KV cache is needed|larger than the available KV",
     "the KV cache cannot hold one max-model-len request: lower --max-model-len, raise "
     "--gpu-memory-utilization (CPU: VLLM_CPU_KVCACHE_SPACE) or use --kv-cache-dtype fp8"),
    (r"max_model_len|max-model-len|max_position_embeddings",
     "--max-model-len exceeds what the model allows: use at most its max_position_embeddings"),
    (r"unrecognized arguments|invalid choice|argument --",
     "a flag is misspelt or not in this vLLM release: check `vllm serve --help` for the exact spelling"),
    (r"Address already in use",
     "the port is taken: let the harness pick one (port=None)"),
    (r"No module named 'vllm'",
     "the engine's Python cannot import vllm: if you set PYTHONPATH, prepend to it "
     "(PYTHONPATH=$PWD/src:$PYTHONPATH) instead of replacing it (labs/tools/run_labs_gpu.sh does), "
     "or run with the Python that has vLLM"),
)
_ERROR_LINE = re.compile(r"(\b\w*(Error|Exception)\b:|error:)\s*\S")
_NOISE = re.compile(r"nanobind|leaked|resource_tracker|warnings\.warn|See root cause above|runtime errors\.")


def engine_error_line(log: str) -> str:
    """The engine's own error line: the last ``SomethingError: ...`` or ``error: ...`` line,
    less vLLM's wrapper ("Engine core initialization failed. See root cause above") and the
    process prefix (``(EngineCore pid=1) ERROR 11-30 06:21:19 [core.py:1349]``)."""
    lines = [l.strip() for l in log.splitlines() if _ERROR_LINE.search(l) and not _NOISE.search(l)]
    if not lines:
        return ""
    line = lines[-1]
    m = re.search(r"\b\w*(Error|Exception)\b:.*|error:.*", line)
    line = m.group(0) if m else line
    if re.search(r"validation errors? for \w+\s*$", line):
        # pydantic puts the field and the reason on the next lines: keep them.
        all_lines = [l.strip() for l in log.splitlines()]
        at = max(i for i, l in enumerate(all_lines) if l.endswith(line))
        detail = [re.sub(r"^\(\w+ pid=\d+\)\s*", "", l) for l in all_lines[at + 1:at + 3] if l]
        line = " ".join([line, *detail])
    return line


def hint_for(log: str, default: str = "read the engine's log (server.log) above the error line") -> str:
    """What to change, judged from the engine's output; ``default`` when no known error matches."""
    line = engine_error_line(log)
    for pattern, hint in _HINTS:
        if re.search(pattern, line) or (not line and re.search(pattern, log)):
            return hint
    for pattern, hint in _HINTS:
        if re.search(pattern, log[-20000:]):
            return hint
    return default


class VllmServer:
    """One ``vllm serve`` process group; use as a context manager (see the module docstring).

    Args:
        model: ``--model`` (a Hub repo or a local directory).
        engine_args: flags (``vllm serve`` names with underscores; see :func:`engine_args_to_cli`).
        env: the engine's environment (``Profile.engine_env()``).
        port: a port to bind, or None for a free one.
        startup_timeout_s: give up when ``/health`` has not answered after this long.
        grace_s: seconds between SIGTERM and SIGKILL at teardown.
        lock: hold the machine-wide engine lock while the server runs (False where the caller
            already holds it, e.g. a child of :func:`servebook.engine_env.run_in_engine_env`).
        python: the interpreter that runs ``vllm serve`` (default: the vLLM environment's).
    """

    def __init__(self, model: str, engine_args: dict | None = None, *, env: dict | None = None,
                 port: int | None = None, startup_timeout_s: float = 600.0, grace_s: float = 10.0,
                 lock: bool = True, python: str | None = None):
        self.model = model
        self.engine_args = dict(engine_args or {})
        self.env = env
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self.lock = lock
        self.python = python
        self.proc: subprocess.Popen | None = None
        self.pgid: int | None = None
        self.startup_s: float | None = None
        self._log_path: Path | None = None
        self._final_log: str | None = None
        self._stack = ExitStack()

    # ------------------------------------------------------------------ command
    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        """The exact command line the server runs."""
        return [self.python or str(vllm_python()), "-m", "servebook.lab.harness.vllm_cli", "serve", self.model,
                "--host", HOST, "--port", str(self.port), *engine_args_to_cli(self.engine_args)]

    def command_str(self) -> str:
        return shlex.join(self.command())

    @property
    def log(self) -> str:
        """Everything the server wrote so far (stdout and stderr)."""
        if self._final_log is not None:
            return self._final_log
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_text(errors="replace")

    @property
    def startup(self) -> StartupLog:
        """The start-up log, parsed by :func:`servebook.startup_log.parse_startup_log`."""
        return parse_startup_log(self.log)

    # ------------------------------------------------------------------ life cycle
    def __enter__(self) -> "VllmServer":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if self.port is None:
            self.port = free_port()
        check_port_free(self.port)
        if self.lock:
            self._stack.enter_context(timed_engine_lock())
        fd, name = tempfile.mkstemp(prefix="servebook-vllm-serve-", suffix=".log")
        os.close(fd)
        self._log_path = Path(name)
        log_handle = open(self._log_path, "w")
        self._stack.callback(log_handle.close)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.command(), stdout=log_handle, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)
        self.pgid = self.proc.pid  # a new session's leader: its pid is the group id
        _LIVE.add(self)
        self._wait_healthy(t0)
        self.startup_s = time.monotonic() - t0

    def _wait_healthy(self, t0: float) -> None:
        url = f"{self.base_url}/health"
        while True:
            code = self.proc.poll()
            if code is not None:
                log = self.log
                line, hint = engine_error_line(log), hint_for(log)
                raise EngineStartError(
                    f"vllm serve exited with status {code} before it was ready.\n"
                    f"  engine's error: {line or '(no error line; see the log)'}\n  what to change: {hint}\n"
                    f"  command: {self.command_str()}",
                    error_line=line, hint=hint, log=log)
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() - t0 > self.startup_timeout_s:
                log = self.log
                raise EngineStartError(
                    f"vllm serve did not answer {url} within {self.startup_timeout_s:.0f} s; "
                    f"raise startup_timeout_s or look at the last log lines:\n{log[-2000:]}",
                    error_line=engine_error_line(log), hint="raise startup_timeout_s", log=log)
            time.sleep(0.5)

    def alive_pids(self) -> list[int]:
        """PIDs still in the server's process group (empty once torn down)."""
        return group_pids(self.pgid) if self.pgid else []

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``grace_s``; release the lock."""
        try:
            if self.pgid is not None:
                kill_group(self.pgid, self.grace_s)
                if self.proc is not None:
                    try:
                        self.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
        finally:
            _LIVE.discard(self)
            self._stack.close()
            if self._log_path is not None and self._final_log is None:
                self._final_log = self.log  # keep the text, remove the temporary file
                self._log_path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ probes
    def get(self, path: str, timeout_s: float = 30.0) -> str:
        with urllib.request.urlopen(f"{self.base_url}{path}", timeout=timeout_s) as r:
            return r.read().decode()

    def metrics_text(self) -> str:
        return self.get("/metrics")

    def metrics(self) -> dict[str, float]:
        """``/metrics`` parsed by prometheus_client (see :func:`servebook.lab.harness.metrics.parse_metrics`)."""
        return parse_metrics(self.metrics_text())

    def complete(self, prompt: str = "hello world", max_tokens: int = 4, timeout_s: float = 300.0) -> dict:
        """One ``/v1/completions`` request (used to warm the engine up before timing)."""
        import json

        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                           "ignore_eos": True, "temperature": 0}).encode()
        req = urllib.request.Request(f"{self.base_url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read().decode())


def group_pids(pgid: int) -> list[int]:
    """Live processes (not zombies) whose process group is ``pgid``, read from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, pg = fields[0], int(fields[2])
        if pg == pgid and state != "Z":
            out.append(int(entry.name))
    return out


def kill_group(pgid: int, grace_s: float = 10.0) -> None:
    """SIGTERM process group ``pgid``; SIGKILL it if anything is alive after ``grace_s``."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_pids(pgid):
        time.sleep(0.2)
    if group_pids(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and group_pids(pgid):
            time.sleep(0.1)


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        try:
            server.stop()
        except Exception:  # noqa: BLE001
            print(f"servebook.lab: could not stop server group {server.pgid}", file=sys.stderr)
