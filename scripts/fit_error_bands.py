#!/usr/bin/env python3
"""Derive the held-out error bands of servebook's predictions; write src/servebook/perf/data/error_bands.json.

    python scripts/fit_error_bands.py           # write it
    python scripts/fit_error_bands.py --check   # exit 1 if the committed file differs

The bands come from held-out measurements only (servebook.lab.e2e.bands: the step-timing points the
calibration's split rule holds out, and the end-to-end jobs no fit saw or that a heldout.toml declared
held out before they ran), priced by the step model and coefficients as they are now: re-run it after
any change of the step model or of calibration.json (tests/test_error_bands.py fails until then).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from servebook.lab.e2e.bands import build  # noqa: E402
from servebook.perf.error_bands import ERROR_BANDS_FILE  # noqa: E402


def text() -> str:
    return json.dumps(build(), indent=1) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    new = text()
    if a.check:
        same = ERROR_BANDS_FILE.exists() and ERROR_BANDS_FILE.read_text() == new
        print("error_bands.json is up to date" if same else "error_bands.json differs: run scripts/fit_error_bands.py")
        sys.exit(0 if same else 1)
    ERROR_BANDS_FILE.write_text(new)
    print(f"wrote {ERROR_BANDS_FILE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
