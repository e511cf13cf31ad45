"""A small Chrome DevTools Protocol client over ``--remote-debugging-pipe``.

Chromium reads commands from file descriptor 3 and writes replies and events to file descriptor 4,
each message a JSON object terminated by a NUL byte. Using the pipe needs no WebSocket library and
opens no debugging port. Only what the browser tests need is here: commands with replies, page
sessions (flattened), and events collected per session.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

# Flags for Debian's chromium as root in a container (see shared/notes/tooling.md), plus: no
# background traffic of the browser's own, and every host name except 127.0.0.1 unresolvable.
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--metrics-recording-only",
    "--safebrowsing-disable-auto-update",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--remote-debugging-pipe",
    "--window-size=1280,900",
]


class CDPError(RuntimeError):
    """A CDP command failed, or Chromium went away."""


def find_chromium() -> str | None:
    """Path of a Chromium binary: $CHROMIUM, or chromium / chromium-browser on PATH."""
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        return explicit
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """A headless Chromium driven over the DevTools pipe.

    Events are kept per session id (``None`` for the browser itself); ``on_event`` handlers run on
    the reader thread and may send commands with :meth:`send_nowait` (used to answer paused
    requests immediately).
    """

    def __init__(self, binary: str, *, user_data_dir: str | None = None):
        self._tmp = tempfile.mkdtemp(prefix="servebook-chromium-") if user_data_dir is None else None
        profile = user_data_dir or os.path.join(self._tmp, "profile")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        self._stderr = open(os.path.join(self._tmp or profile, "chromium-stderr.log"), "wb") \
            if self._tmp else subprocess.DEVNULL
        # Chromium wants the pipe on fds 3 and 4 exactly. Move our ends above 9 first so that the
        # dup2 calls in the child cannot clobber each other; every other fd of ours is
        # close-on-exec (Python's default), so close_fds=False leaks nothing else.
        high_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10)
        high_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        to_chrome_r, from_chrome_w = high_r, high_w

        def wire_fds() -> None:  # runs in the child between fork and exec
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
            close_fds=False, preexec_fn=wire_fds,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id = 0
        self._lock = threading.Lock()
        self._replies: dict[int, dict] = {}
        self._reply_ready = threading.Condition()
        self.events: dict[str | None, list[dict]] = defaultdict(list)
        self.handlers: list[Callable[[dict], None]] = []
        self._closed = False
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    # -- transport ---------------------------------------------------------
    def _read_loop(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_chrome, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "id" in message:
                    with self._reply_ready:
                        self._replies[message["id"]] = message
                        self._reply_ready.notify_all()
                else:
                    self.events[message.get("sessionId")].append(message)
                    for handler in list(self.handlers):
                        handler(message)
        with self._reply_ready:
            self._closed = True
            self._reply_ready.notify_all()

    def send_nowait(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        """Send a command without waiting for its reply; returns its id."""
        with self._lock:
            self._next_id += 1
            message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
            if session:
                message["sessionId"] = session
            os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
            return self._next_id

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout_s: float = 30.0) -> dict:
        """Send a command and return its result; raise CDPError on an error reply or timeout."""
        command_id = self.send_nowait(method, params, session)
        deadline = time.monotonic() + timeout_s
        with self._reply_ready:
            while command_id not in self._replies:
                if self._closed:
                    raise CDPError(f"Chromium exited while waiting for {method}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CDPError(f"no reply to {method} within {timeout_s} s")
                self._reply_ready.wait(remaining)
            reply = self._replies.pop(command_id)
        if "error" in reply:
            raise CDPError(f"{method} failed: {reply['error']}")
        return reply.get("result", {})

    # -- pages -------------------------------------------------------------
    def new_page(self) -> tuple[str, str, str]:
        """Open a blank tab in a fresh browser context (empty storage, like a first visit).

        Returns (context id, target id, flattened session id); close with :meth:`close_page`.
        """
        context = self.send("Target.createBrowserContext")["browserContextId"]
        target = self.send("Target.createTarget", {"url": "about:blank",
                                                   "browserContextId": context})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        return context, target, session

    def close_page(self, context: str, target: str) -> None:
        """Close a tab opened by :meth:`new_page` and drop its browser context."""
        for method, params in (("Target.closeTarget", {"targetId": target}),
                               ("Target.disposeBrowserContext", {"browserContextId": context})):
            try:
                self.send(method, params, timeout_s=10)
            except CDPError:
                pass

    def wait_for_event(self, session: str, method: str, timeout_s: float, start: int = 0) -> dict:
        """First event ``method`` of ``session`` at index >= start, waiting up to timeout_s."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for event in self.events[session][start:]:
                if event["method"] == method:
                    return event
            time.sleep(0.05)
        raise CDPError(f"no {method} within {timeout_s} s")

    def evaluate(self, session: str, expression: str, timeout_s: float = 30.0) -> Any:
        """Value of a JavaScript expression in the page (awaits promises)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session, timeout_s)
        if "exceptionDetails" in result:
            raise CDPError(f"evaluating {expression[:60]!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout_s=5)
        except CDPError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._tmp:
            if hasattr(self._stderr, "close"):
                self._stderr.close()
            shutil.rmtree(self._tmp, ignore_errors=True)

    def stderr_tail(self, chars: int = 2000) -> str:
        """End of Chromium's stderr (for failure messages)."""
        if not self._tmp:
            return ""
        path = Path(self._tmp, "chromium-stderr.log")
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""
