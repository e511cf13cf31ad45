"""`bash scripts/lab.sh` serves the notebooks in JupyterLab: one headless run, checked through the
server's REST API and the kernel protocol.

The script starts (with SERVEBOOK_LAB_NO_INSTALL=1: a test never installs), asked to open one
notebook, on a free 127.0.0.1 port with a token of our own and Jupyter folders in a temporary
directory (so neither your home configuration nor your kernels take part). Then: the landing page
is that notebook; the MyST notebook opens as a notebook through the contents API (jupytext's
server extension); the markdown default viewer JupyterLab is served is jupytext's notebook view;
ipywidgets' lab extension is installed and enabled; a session's kernel runs the notebook's first
cell in .venv, and a slider whose value JupyterLab's widget manager changes (the comm message it
sends) recomputes its observer. Shut down through the API, the server's process group and the
kernel are gone.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import jupytext
import pytest
from jupyter_client import BlockingKernelClient
from processes import alive, group_alive

from servebook.lab.harness.server import free_port

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "notebooks/kv_per_token.md"
START_LIMIT_S = 90      # the server starts in ~3 s here; generous for a loaded 2-core machine
STOP_LIMIT_S = 30


class Lab:
    """The running server: JSON requests with the token."""

    def __init__(self, port: int, token: str, process: subprocess.Popen, log: Path):
        self.base, self.token, self.process, self.log = f"http://127.0.0.1:{port}", token, process, log

    def request(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def wait_until_up(self) -> None:
        deadline = time.monotonic() + START_LIMIT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"scripts/lab.sh exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                self.request("GET", "/api/status")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
        pytest.fail(f"JupyterLab did not answer on {self.base} within {START_LIMIT_S} s:\n{self.log.read_text()[-3000:]}")


@pytest.fixture
def lab(tmp_path):
    port, token = free_port(), secrets.token_hex(16)
    jupyter = tmp_path / "jupyter"
    env = {**os.environ, "SERVEBOOK_LAB_NO_INSTALL": "1", "PORT": str(port),
           "JUPYTER_CONFIG_DIR": str(jupyter / "config"), "JUPYTER_DATA_DIR": str(jupyter / "data"),
           "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime")}
    log = tmp_path / "lab.log"
    with log.open("w") as out:
        process = subprocess.Popen(["bash", str(ROOT / "scripts" / "lab.sh"), NOTEBOOK, "--no-browser",
                                    f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0"],
                                   cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Lab(port, token, process, log)
    try:
        server.wait_until_up()
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)   # only when the test failed before its shutdown
            process.wait(STOP_LIMIT_S)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _execute(client: BlockingKernelClient, code: str) -> str:
    """Run ``code`` in the kernel; its stdout. A cell that raises fails the test."""
    chunks: list[str] = []

    def collect(msg):
        if msg["msg_type"] == "stream":
            chunks.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            chunks.append("\n".join(msg["content"]["traceback"]))

    reply = client.execute_interactive(code, timeout=60, output_hook=collect)
    assert reply["content"]["status"] == "ok", "".join(chunks)
    return "".join(chunks)


def test_lab_opens_a_myst_notebook_runs_a_cell_and_widgets_recompute(lab, tmp_path):
    # `bash scripts/lab.sh notebooks/<x>.md` lands on that notebook.
    with pytest.raises(urllib.error.HTTPError) as landing:
        urllib.request.build_opener(_NoRedirect).open(f"{lab.base}/?token={lab.token}", timeout=30)
    location = landing.value.headers.get("Location", "")
    assert landing.value.code == 302 and urllib.parse.urlsplit(location).path == f"/lab/tree/{NOTEBOOK}", (
        landing.value.code, location)

    # The .md opens as a notebook (jupytext's contents manager), cell for cell as jupytext reads it.
    model = lab.request("GET", f"/api/contents/{NOTEBOOK}?type=notebook&content=1")
    assert model["type"] == "notebook", model["type"]
    code = [c["source"] for c in model["content"]["cells"] if c["cell_type"] == "code"]
    assert code == [c.source for c in jupytext.read(ROOT / NOTEBOOK).cells if c.cell_type == "code"]

    # A double click opens markdown with jupytext's notebook view: the default JupyterLab is served.
    settings = lab.request("GET", "/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
    viewers = settings["schema"]["properties"]["defaultViewers"]["default"]
    assert viewers.get("markdown") == viewers.get("myst") == "Jupytext Notebook", viewers
    # ... and that is the name jupytext's lab extension gives its notebook factory.
    factories = Path(sys.prefix, "share/jupyter/labextensions/jupyterlab-jupytext/static").glob("*.js")
    assert any('"Jupytext Notebook"' in js.read_text(errors="replace") for js in factories)

    # ipywidgets' front end is installed in JupyterLab and enabled.
    extensions = {e["name"]: e for e in lab.request("GET", "/lab/api/extensions")}
    widgets = [e for e in extensions.values() if "jupyterlab-manager" in e["name"]]
    assert widgets and all(e["enabled"] and e["installed"] for e in widgets), sorted(extensions)

    # A session for the notebook, as JupyterLab opens one; its kernel runs in .venv.
    session = lab.request("POST", "/api/sessions", {"path": NOTEBOOK, "type": "notebook", "name": "kv_per_token.md",
                                                   "kernel": {"name": "python3"}})
    kernel_id = session["kernel"]["id"]
    client = BlockingKernelClient(connection_file=str(tmp_path / "jupyter" / "runtime" / f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        kernel_pid, prefix = _execute(client, "import os, sys; print(os.getpid(), sys.prefix)").split()
        assert Path(prefix).resolve() == Path(sys.prefix).resolve(), f"the lab's python3 kernel runs in {prefix}, not in .venv ({sys.prefix})"
        assert "KV cache per token (bf16): 131,072 bytes = 128 KiB" in _execute(client, code[0])

        # A widget recomputes when the front end moves it: JupyterLab's widget manager sends this
        # comm message (ipywidgets' protocol, method "update") when a slider is dragged.
        model_id = _execute(client, "import ipywidgets as w\n"
                                    "slider, doubled = w.IntSlider(value=1, max=100), []\n"
                                    "slider.observe(lambda change: doubled.append(2 * change['new']), names='value')\n"
                                    "print(slider.model_id)").strip()
        client.session.send(client.shell_channel.socket, client.session.msg(
            "comm_msg", {"comm_id": model_id, "data": {"method": "update", "state": {"value": 21},
                                                       "buffer_paths": []}}))
        assert _execute(client, "print(slider.value, doubled)").strip() == "21 [42]"
    finally:
        client.stop_channels()

    lab.request("DELETE", f"/api/sessions/{session['id']}")
    lab.request("POST", "/api/shutdown")
    lab.process.wait(STOP_LIMIT_S)
    deadline = time.monotonic() + STOP_LIMIT_S
    while (group_alive(lab.process.pid) or alive(int(kernel_pid))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_alive(lab.process.pid), "processes of the lab server's group outlived its shutdown"
    assert not alive(int(kernel_pid)), "the notebook's kernel outlived the lab server"
