"""One Python of the vLLM environment, shared by the ``vllm_env`` tests that only read facts from vLLM.

Each of those tests used to start its own ``.venv-vllm`` interpreter, and each paid for
``import vllm`` (about 8-10 s on 2 cores). ``VllmProbe`` starts that interpreter once, running
this file as a server that imports vLLM, then runs each test's script in it on request, one after
the other, each in a fresh ``__main__`` namespace with its own ``sys.argv``, and answers as
``subprocess.run`` would: return code, captured stdout and stderr. Scripts share the process, so
a script must not leave global state behind (``unittest.mock`` patches inside ``with`` are fine).
The scripts start no engine, so the engine lock is not needed.

Protocol: one JSON line per request on the server's stdin (``{"script": path, "argv": [...]}``)
and one JSON line per answer on a copy of its original stdout; the server points its own file
descriptor 1 at stderr, so that vLLM's log handlers (bound to stdout at import) cannot corrupt
the answers.
"""
from __future__ import annotations

import json
import os
import selectors
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ProbeResult:
    returncode: int
    stdout: str
    stderr: str


class VllmProbe:
    def __init__(self, python: Path, env: dict[str, str] | None = None, start_timeout_s: float = 300):
        self._log = tempfile.TemporaryFile(mode="w+")  # the server's own stderr (vLLM's log lines)
        self._proc = subprocess.Popen([str(python), "-u", __file__], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        ready = self._answer(start_timeout_s)
        if ready.get("ready") is not True:
            raise RuntimeError(f"the vLLM probe did not start: {ready}")
        self.vllm_version = ready["vllm_version"]

    def _answer(self, timeout_s: float) -> dict:
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                tail = self.log_tail()
                self._proc.kill()  # a later run() fails at once instead of waiting again
                self._proc.wait()
                raise TimeoutError(f"the vLLM probe gave no answer in {timeout_s:.0f} s; its log ends:\n{tail}")
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait(timeout=30)
            raise RuntimeError(f"the vLLM probe exited ({self._proc.returncode}); its log ends:\n" + self.log_tail())
        return json.loads(line)

    def run(self, script: str | Path, *argv: str, timeout_s: float = 300) -> ProbeResult:
        """Run the Python file ``script`` with ``argv`` as ``python script ARGV...`` would."""
        self._proc.stdin.write(json.dumps({"script": str(script), "argv": [str(a) for a in argv]}) + "\n")
        self._proc.stdin.flush()
        answer = self._answer(timeout_s)
        return ProbeResult(answer["returncode"], answer["stdout"], answer["stderr"])

    def run_source(self, tmp_dir: Path, source: str, *argv: str, timeout_s: float = 300) -> ProbeResult:
        """Run ``source`` (the text of a script) as ``python -c`` would, from a file in ``tmp_dir``."""
        path = Path(tempfile.mkstemp(suffix=".py", dir=tmp_dir)[1])
        path.write_text(source)
        return self.run(path, *argv, timeout_s=timeout_s)

    def log_tail(self, chars: int = 4000) -> str:
        self._log.seek(0)
        return self._log.read()[-chars:]

    def close(self) -> None:
        if self._log.closed:
            return
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


def _serve() -> None:  # runs in the vLLM environment
    import contextlib
    import io
    import runpy
    import sys
    import traceback

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    import vllm

    answers.write(json.dumps({"ready": True, "vllm_version": vllm.__version__}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        out, err, code = io.StringIO(), io.StringIO(), 0
        saved_argv, saved_path = sys.argv[:], sys.path[:]
        sys.argv = [request["script"], *request["argv"]]
        sys.path.insert(0, str(Path(request["script"]).resolve().parent))  # as `python script` does
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    runpy.run_path(request["script"], run_name="__main__")
                except SystemExit as exc:
                    if exc.code is None or isinstance(exc.code, int):
                        code = exc.code or 0
                    else:
                        print(exc.code, file=sys.stderr)
                        code = 1
                except BaseException:  # noqa: BLE001 - reported to the test as python would
                    traceback.print_exc()
                    code = 1
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path
        answers.write(json.dumps({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\n")


if __name__ == "__main__":
    _serve()
