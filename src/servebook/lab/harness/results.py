"""Save a lab's measurements as JSON with provenance (schema ``servebook.lab/1``).

Where: ``$SERVEBOOK_LAB_RESULTS`` if set (the GPU runner points it at ``$OUT``), else
``labs/results/labs/``. File name: ``<lab>_<profile>.json``. Every file carries ``date``
(UTC), ``gpu`` (name, count, driver, memory as the engine's torch sees them),
``vllm_version``, ``profile``, ``model_id``, the model ``config`` and its ``config_sha256``,
``engine_args`` (every flag of every engine the lab started, in ``measurements``) and
``environment`` (the ``VLLM_*`` variables the engines ran with).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from servebook.lab.harness.offline import engine_provenance
from servebook.lab.harness.profiles import Profile
from servebook.lab.harness.server import LOCK_WAIT_S
from servebook.provenance import config_sha256, utc_now_iso
from servebook.records import results_path

SCHEMA = "servebook.lab/1"
DEFAULT_DIR = results_path("labs")
REQUIRED = ("schema", "lab", "date", "gpu", "vllm_version", "profile", "model_id", "config",
            "config_sha256", "engine_args", "measurements")


def results_dir() -> Path:
    return Path(os.environ.get("SERVEBOOK_LAB_RESULTS") or DEFAULT_DIR)


def save_result(lab: str, profile: Profile, measurements: dict, *, engine_args: dict | None = None,
                notes: str = "") -> Path:
    """Write ``<lab>_<profile>.json``; returns its path.

    Args:
        lab: ``"l1_memory_budget"`` etc.
        profile: the profile the lab ran in.
        measurements: the lab's data (JSON-serialisable; each engine's flags inside it).
        engine_args: flags shared by every engine of the lab (the profile's base flags by default).
        notes: one line on method.
    """
    env = profile.engine_env()
    prov = engine_provenance(env)
    doc = {
        "schema": SCHEMA,
        "lab": lab,
        "date": utc_now_iso(),
        "gpu": prov["gpu"],
        "vllm_version": prov["vllm_version"],
        "profile": profile.name,
        "model_id": profile.model_id,
        "hf_model": profile.hf_model,
        "weights": "real" if profile.hf_model else "dummy (random, load_format=dummy)",
        "config": profile.model_config,
        "config_sha256": config_sha256(profile.model_config),
        "engine_args": dict(profile.engine_args, **(engine_args or {})),
        "environment": {k: v for k, v in env.items() if k.startswith("VLLM_")},
        "notes": notes,
        # Time this lab's process waited for other engines on a shared machine (not lab time).
        "harness": {"engine_lock_wait_s": round(LOCK_WAIT_S[0], 1)},
        "measurements": measurements,
    }
    out = results_dir() / f"{lab}_{profile.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    return out


def load_result(path: str | Path) -> dict:
    """Read a lab result; :class:`servebook.lab.errors.LabError` if provenance fields are missing."""
    from servebook.lab.errors import LabError

    doc = json.loads(Path(path).read_text())
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise LabError(f"{path} lacks {', '.join(missing)}; re-run the lab to record it with provenance")
    return doc
