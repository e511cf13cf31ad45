"""A throw-away Ray cluster on 127.0.0.1: a head and worker nodes started with ``ray start``.

The same commands as on real machines (``ray start --head`` on one, ``ray start --address``
on the others), here all on one host, each node on its own ports, started through
``ray_loopback.py`` so that Ray keeps 127.0.0.1 instead of swapping in the host's routable
address. Every node gets ``--node-ip-address 127.0.0.1``; the dashboard and usage stats are
off (``--include-dashboard false``, ``--disable-usage-stats``, ``RAY_USAGE_STATS_ENABLED=0``);
token authentication is on with a token of this run (``RAY_AUTH_MODE=token``,
``RAY_AUTH_TOKEN_PATH``), as Ray 2.60 asks of any cluster. :func:`foreign_connections`
checks that no process of the cluster holds a connection to anything but loopback.

Every process of the cluster and of the drivers carries ``SERVEBOOK_RAY_TAG=<uuid>`` in its
environment (Ray's processes inherit it from ``ray start``), so :func:`tagged_processes`
finds them without trusting process names, and :meth:`LocalRayCluster.stop` can prove that
nothing is left after ``ray stop --force`` and the process-group kills.
"""
from __future__ import annotations

import ipaddress
import os
import secrets
import signal
import sys
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from servebook.lab.harness.server import free_port

TAG = "SERVEBOOK_RAY_TAG"
LOOPBACK_START = Path(__file__).with_name("ray_loopback.py")


def tagged_processes(tag: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment holds ``SERVEBOOK_RAY_TAG=tag``."""
    marker = f"{TAG}={tag}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                        errors="replace").strip()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def _hex_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} writes it (32-bit words in host byte order)."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)) if sys.byteorder == "little" else raw
    ip = ipaddress.ip_address(words)
    return ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip


def foreign_connections(pids) -> list[str]:
    """Sockets of ``pids`` connected (TCP or UDP) to an address other than loopback."""
    out = []
    for pid in pids:
        try:
            inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                      if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
            tables = {name: Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
                      for name in ("tcp", "tcp6", "udp", "udp6")}
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        for name, lines in tables.items():
            for line in lines:
                fields = line.split()
                remote, inode = fields[2], fields[9]
                ip = _hex_ip(remote.split(":")[0])
                if inode in inodes and not ip.is_unspecified and not ip.is_loopback:
                    out.append(f"pid {pid} {name} -> {ip}")
    return out


class LocalRayCluster:
    """``ray start --head`` (no CPUs: it only coordinates) plus ``workers`` nodes of ``cpus_per_worker``."""

    def __init__(self, ray_bin: Path, env: dict, workers: int = 2, cpus_per_worker: int = 1):
        self.ray_bin = str(ray_bin)
        self.python = str(Path(ray_bin).with_name("python"))
        self.tag = uuid.uuid4().hex
        self.temp_dir = tempfile.mkdtemp(prefix="sbray-", dir="/tmp")   # short: Ray's socket paths
        token = Path(self.temp_dir) / "auth_token"
        token.write_text(secrets.token_hex(32))
        self.env = dict(env, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token),
                        **{TAG: self.tag})
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.workers, self.cpus_per_worker = workers, cpus_per_worker
        self.nodes: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def _node_ports(self, index: int) -> list[str]:
        base = 21000 + 200 * index
        return ["--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
                "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
                "--runtime-env-agent-port", str(free_port()), "--metrics-export-port", str(free_port()),
                "--min-worker-port", str(base), "--max-worker-port", str(base + 199)]

    def _start_node(self, index: int, args: list[str]) -> None:
        log = Path(self.temp_dir) / f"ray-start-{index}.log"
        handle = open(log, "w")
        self.logs.append(log)
        self.nodes.append(subprocess.Popen(
            [self.python, str(LOOPBACK_START), "start", "--node-ip-address", "127.0.0.1", "--disable-usage-stats", "--block",
             *self._node_ports(index), *args],
            stdout=handle, stderr=subprocess.STDOUT, env=self.env, start_new_session=True))

    def start(self, timeout_s: float = 150, attempts: int = 2) -> None:
        """Start the head, then the workers one at a time (each must register before the next).

        ``ray start`` gives a node 30 s to register with the GCS (``ray/_private/node.py``); on a
        busy 2-core machine that can pass, so a node whose ``ray start`` exits early is started
        again, up to ``attempts`` times.
        """
        head = ["--head", "--port", str(self.port), "--num-cpus", "0", "--include-dashboard", "false",
                "--temp-dir", self.temp_dir]
        for index in range(self.workers + 1):
            args = head if index == 0 else ["--address", self.address, "--num-cpus", str(self.cpus_per_worker)]
            for attempt in range(attempts):
                self._start_node(index, args + (["--ray-client-server-port", str(free_port())] if index == 0 else []))
                try:
                    self.wait_for_nodes(index + 1, timeout_s)
                    break
                except RuntimeError:
                    if attempt == attempts - 1:
                        raise
                    print(f"ray start of node {index} exited early; starting it again\n{self.log_tail(800)}")
                    self.nodes.pop()
                    if index == 0:                               # free the GCS port for the next try
                        subprocess.run([self.ray_bin, "stop", "--force"], capture_output=True, env=self.env,
                                       timeout=60)

    def alive_nodes(self) -> int:
        """Nodes the GCS counts as alive (asked through ``ray.nodes()`` in the vLLM environment)."""
        code = ("import sys; sys.path.insert(0, %r); import ray_loopback, ray; "
                "ray.init(address=%r, logging_level='ERROR', log_to_driver=False); "
                "print(sum(1 for n in ray.nodes() if n['Alive']))" % (str(LOOPBACK_START.parent), self.address))
        proc = subprocess.run([self.python, "-c", code], capture_output=True, text=True, env=self.env, timeout=60)
        lines = proc.stdout.strip().splitlines()
        return int(lines[-1]) if proc.returncode == 0 and lines and lines[-1].isdigit() else 0

    def wait_for_nodes(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [p.args for p in self.nodes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"ray start exited early: {dead}\n{self.log_tail()}")
            if self.alive_nodes() >= count:
                return
            time.sleep(2)
        raise TimeoutError(f"{count} Ray nodes not up within {timeout_s:.0f} s\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-chars:]}" for p in self.logs if p.exists())

    def engine_worker_pids(self) -> dict[int, str]:
        """Ray worker processes that run the vLLM stage (their title names the UDF)."""
        return {pid: cmd for pid, cmd in tagged_processes(self.tag).items()
                if cmd.startswith("ray::") and "vLLM" in cmd}

    def stop(self, timeout_s: float = 60) -> dict[int, str]:
        """Tear the cluster down: ``ray stop --force`` (every Ray process of this machine's user,
        so run it only where no other Ray cluster runs), then SIGKILL to each ``ray start``
        process group. Returns the tagged processes still alive ``timeout_s`` later (then kill -9'd)."""
        subprocess.run([self.ray_bin, "stop", "--force"], capture_output=True, env=self.env, timeout=60)
        for node in self.nodes:
            try:
                os.killpg(node.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.wait(timeout=10)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and tagged_processes(self.tag):
            time.sleep(0.5)
        left = tagged_processes(self.tag)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left
