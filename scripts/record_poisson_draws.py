"""Write src/servebook/simulator/poisson_draws.json: numpy's standard exponential draws of
``numpy.random.default_rng(0)``, the stream ``OnlineWorkload.requests`` reads arrival gaps from for
Poisson traffic (numpy's ``gamma(1, scale)`` is ``scale`` x that stream, digit for digit). Where numpy
is missing (a browser's Pyodide) the workload reads the same numbers from this file, so ``servebook
tune`` gives the same answer there. tests/test_numpy_free.py checks the file against numpy.

Run: ``PYTHONPATH=src .venv/bin/python scripts/record_poisson_draws.py``
"""
from __future__ import annotations

import json

import numpy as np

from servebook.simulator.online import MAX_SIMULATED_REQUESTS, POISSON_DRAWS_FILE

draws = np.random.default_rng(0).standard_exponential(MAX_SIMULATED_REQUESTS)
doc = {"about": f"numpy.random.default_rng(0).standard_exponential({MAX_SIMULATED_REQUESTS}) with numpy "
                f"{np.__version__} (written by scripts/record_poisson_draws.py; never edit by hand)",
       "seed": 0, "draws": [float(x) for x in draws]}
POISSON_DRAWS_FILE.write_text(json.dumps(doc, indent=0) + "\n")
print(f"wrote {len(draws)} draws to {POISSON_DRAWS_FILE}")
