"""servebook stands on its own: a wheel built from the checkout, installed (not editable) in a fresh venv,
runs every calculator command from a directory outside the checkout.

No network: the wheel is built with the book venv's setuptools (``--no-build-isolation``), installed with
its pip (``--python`` into a venv created ``--without-pip``, ``--no-index --no-deps``). The new venv sees
only servebook's declared dependencies (numpy, prometheus_client) from the book venv, through a ``.pth``
file naming a folder that holds nothing but links to them: not ``--system-site-packages``, which would also
expose the editable servebook and every other package of the book venv.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow
#: The import folders of pyproject.toml's [project] dependencies, as the book venv holds them.
DEPENDENCIES = ("numpy", "numpy.libs", "prometheus_client")


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv python, venv bin, an empty working directory outside the checkout, the environment)."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Without PYTHONPATH (a checkout's src/ on it would make pip see servebook as installed already
    # and skip the wheel) and without the variables that point servebook at this checkout.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SERVEBOOK_RESULTS_DIR", "VIRTUAL_ENV")}
    # Build from a copy, so the checkout gets no build/ or egg-info while other tests run.
    project = tmp / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, project / name)
    shutil.copytree(ROOT / "src", project / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", str(dist), str(project)], env=env)
    wheel = next(dist.glob("servebook-*.whl"))

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    dependencies = tmp / "dependencies_only"
    dependencies.mkdir()
    outer = Path(sysconfig.get_path("purelib"))
    for name in DEPENDENCIES:
        if (outer / name).exists():
            (dependencies / name).symlink_to(outer / name)
    (site / "dependencies_only.pth").write_text(f"{dependencies}\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
          str(wheel)], env=env)

    work = tmp / "elsewhere"
    work.mkdir()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return python, venv / "bin", work, env


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    python, _, work, env = installed
    out = _run([str(python), "-c", "import servebook, numpy; print(servebook.__file__)"], cwd=work, env=env)
    where = Path(out.stdout.strip())
    assert python.parent.parent in where.parents and ROOT not in where.parents


COMMANDS = {
    "versions": ["versions", "--json"],
    "models": ["models", "--json"],
    "plan": ["plan", "--config", "llama-3.1-8b", "--gpu", "h200", "--json"],
    "fleet": ["fleet", "--config", "llama-3.1-8b", "--gpu", "h200", "--gpus", "8", "--requests", "1000",
              "--input-tokens", "2000", "--output-tokens", "500", "--json"],
    "step": ["step", "--config", "llama-3.1-8b", "--gpu", "h200", "--phase", "decode", "--batch", "8",
             "--context", "1000", "--json"],
    "simulate": ["simulate", "--requests", "20", "--config", "llama-3.1-8b", "--gpu", "h200", "--json"],
    # a drill whose exhibit and answer read a shipped H200 start-up log
    "drills": ["drills", "show", "memory-padding-warning", "--answer", "--json"],
}


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_runs_from_outside_the_checkout(installed, name):
    _, bin_dir, work, env = installed
    out = _run([str(bin_dir / "servebook"), *COMMANDS[name]], cwd=work, env=env)
    data = json.loads(out.stdout)
    assert data
    if name == "plan":
        assert data["model"] and data["num_gpu_blocks"] > 0 and "fitted" in data["coefficients_status"]
    if name == "step":
        assert data["step_s"] > 0
    if name == "drills":
        assert "padding layers" in json.dumps(data)


def test_drills_list_runs_from_outside_the_checkout(installed):
    _, bin_dir, work, env = installed
    rows = json.loads(_run([str(bin_dir / "servebook"), "drills", "list", "--json"], cwd=work, env=env).stdout)
    assert len(rows) >= 20 and "memory-padding-warning" in {r["id"] for r in rows}
    # questions computed from recorded lab results name the results file they lack instead of failing the list
    missing = [r for r in rows if r["question"].startswith("(question not available here")]
    assert all(str(work / "labs" / "results") in r["question"] for r in missing)
    assert len(missing) < len(rows) / 4


def test_the_wheel_ships_every_data_file(installed):
    """pyproject.toml's package-data globs miss nothing under servebook/data (a new data folder needs its glob)."""
    python, _, work, env = installed
    out = _run([str(python), "-c", "import servebook.shipped as s; print(s.DATA_DIR)"], cwd=work, env=env)

    def files(root: Path) -> set[str]:
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}

    checkout, wheel = files(ROOT / "src" / "servebook" / "data"), files(Path(out.stdout.strip()))
    assert checkout and not checkout - wheel, f"left out of the wheel: {sorted(checkout - wheel)[:10]}"
