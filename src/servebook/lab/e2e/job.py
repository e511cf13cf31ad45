"""Record end-to-end offline jobs on real engines: one engine per model, its jobs, one JSON per model.

    python -m servebook.lab.e2e.job plan [--target e2e-a]        # the jobs and fleet's seconds; no vLLM
    python -m servebook.lab.e2e.job check                         # imports and the plan, no engine
    python -m servebook.lab.e2e.job run --target e2e-a --out DIR  # on the GPU node (labs/tools/run_labs_gpu.sh)

``run`` starts each model's engine in a child process (:mod:`servebook.lab.e2e.child`, so its GPU
memory is freed before the next model), appends the child's output to ``DIR/<target>.log`` and
prints the child's progress lines. The child writes ``DIR/e2e_<model>.json`` (schema
``servebook.e2e/1``) after every job. ``$SERVEBOOK_E2E_MODELS`` (comma-separated) replaces the
target's models. With ``$SERVEBOOK_LAB_DEADLINE`` set (:mod:`servebook.lab.harness.deadline`) a model is not
started when its engine start and shortest job cannot finish in time, a job is not started when fleet's
prediction (with a margin) does not fit, and a child still running at the deadline is killed.
The plan is ``servebook/data/e2e_jobs.toml`` (:mod:`servebook.lab.e2e.plan`); ``--plan`` (or
``$SERVEBOOK_E2E_PLAN``) reads another.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servebook.lab.harness import deadline
from servebook.lab.e2e.child import LOG_MARK
from servebook.lab.e2e.plan import ENGINE_START_S, E2EPlan, load_plan, plan_text, predict, job_lengths

MODELS_ENV = "SERVEBOOK_E2E_MODELS"
#: Environment variable naming another plan TOML (a test's tiny model through the GPU runner).
PLAN_ENV = "SERVEBOOK_E2E_PLAN"
#: Seconds a child may run past the deadline before it is killed (the runner's cap is 15 s later).
KILL_GRACE_S = 8.0


def _models(plan: E2EPlan, target: str | None, models: str | None) -> list[str]:
    chosen = models or os.environ.get(MODELS_ENV, "")
    if chosen.strip():
        names = [m.strip() for m in chosen.split(",") if m.strip()]
        for n in names:
            plan.model(n)
        return names
    if not target:
        return list(plan.models)
    return plan.target_models(target)


def _case(plan: E2EPlan, model: str, out_dir: Path, log: Path, gpu: str) -> dict:
    mp = plan.model(model)
    return {"model": model, "kind": mp.kind, "config": mp.config(),
            "engine_args": mp.engine_args, "out": str(out_dir / f"e2e_{model}.json"), "log": str(log), "gpu": gpu,
            "record_steps": os.environ.get("SERVEBOOK_E2E_STEPS", "1") != "0",
            "environment": mp.environment,
            "jobs": [j.as_case() for j in mp.jobs], "warm_up_jobs": [j.as_case() for j in mp.warm_up]}


def _shortest_job_s(case: dict) -> float:
    from servebook.lab.e2e.plan import Job

    best = None
    for j in case["jobs"]:
        job = Job.from_case(case["model"], j)
        try:
            inputs, outputs = job_lengths(job, int(case["engine_args"]["max_model_len"]))
            s = predict(case["config"], inputs, outputs, case["engine_args"], gpu=case["gpu"])["seconds"]
        except Exception:  # noqa: BLE001
            s = 0.0
        best = s if best is None else min(best, s)
    return best or 0.0


def _echo(reader) -> None:
    """Print the child's progress lines and errors (not vLLM's warnings, which quote tracebacks)."""
    for line in reader.readlines():
        if line.startswith("[e2e]") or ("Error" in line and "WARNING" not in line):
            print(line.rstrip(), flush=True)


def run_model(case: dict, log: Path) -> int | str:
    """Run one model's child, streaming its ``[e2e]`` lines; returns its exit status or ``"killed"``."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(case, fh)
    with open(log, "a") as f:
        f.write(f"{LOG_MARK}{case['model']} {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
    with open(log, "a") as f:
        proc = subprocess.Popen([sys.executable, "-m", "servebook.lab.e2e.child", fh.name], stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    status: int | str = "killed"
    with open(log, errors="replace") as reader:
        reader.seek(0, 2)
        try:
            while True:
                _echo(reader)
                code = proc.poll()
                if code is not None:
                    status = code
                    _echo(reader)
                    break
                left = deadline.seconds_left()
                if left is not None and left < -KILL_GRACE_S:
                    print(f"[e2e] {case['model']}: deadline passed, killing the engine", flush=True)
                    break
                time.sleep(1.0)
        finally:
            from servebook.lab.harness.server import kill_group

            kill_group(proc.pid, 5)
            os.unlink(fh.name)
    return status


def run(plan: E2EPlan, models: list[str], out_dir: Path, log: Path, gpu: str) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for model in models:
        case = _case(plan, model, out_dir, log, gpu)
        need = ENGINE_START_S + 1.3 * _shortest_job_s(case)
        if not deadline.fits(need):
            print(f"[e2e] {model}: not started, needs ~{need:.0f} s and {deadline.seconds_left():.0f} s are left",
                  flush=True)
            continue
        t0 = time.monotonic()
        status = run_model(case, log)
        print(f"[e2e] {model}: exit {status} after {time.monotonic() - t0:.0f} s; "
              f"{case['out'] if Path(case['out']).exists() else 'NO RESULT'}", flush=True)
        failed += status != 0
    return 1 if failed else 0


def check(plan: E2EPlan, targets: dict) -> None:
    """Imports the engine side needs, the vLLM version, and the plan (no engine starts)."""
    import servebook.lab.e2e.child  # noqa: F401
    from servebook.provenance import vllm_version

    try:
        import vllm  # noqa: F401
        have = f"vllm {vllm.__version__}"
    except ImportError:
        have = f"vllm not importable here (metadata: {vllm_version()})"
    print(have)
    print(plan_text(plan, targets))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m servebook.lab.e2e.job", description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["plan", "check", "run"])
    ap.add_argument("--target", help="runner target (e2e-a, e2e-b); default: every model of the plan")
    ap.add_argument("--models", help=f"comma-separated models instead of the target's (or ${MODELS_ENV})")
    ap.add_argument("--plan", default=os.environ.get(PLAN_ENV) or None,
                    help=f"plan TOML (default: ${PLAN_ENV}, else servebook/data/e2e_jobs.toml)")
    ap.add_argument("--out", help="folder for e2e_<model>.json and the log (run)")
    ap.add_argument("--gpu", default="h200", help="catalogue GPU fleet predicts for (default h200)")
    args = ap.parse_args(argv)
    plan = load_plan(args.plan)
    models = _models(plan, args.target, args.models)
    targets = {args.target or "models": models}
    if args.mode == "plan":
        print(plan_text(plan, targets, gpu=args.gpu))
        return 0
    if args.mode == "check":
        check(plan, targets)
        return 0
    if not args.out:
        ap.error("run needs --out DIR")
    out = Path(args.out)
    return run(plan, models, out, out / f"{args.target or 'e2e'}.log", args.gpu)


if __name__ == "__main__":
    sys.exit(main())
