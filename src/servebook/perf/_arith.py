"""The few non-arithmetic operations of the perf formulas, for Python floats and numpy arrays alike.

The step-time formulas (:mod:`servebook.perf.work`, :mod:`servebook.perf.model`) are
written once, with ``+ - * / **`` and these helpers, so that the same code evaluates
whole arrays (calibration, sweeps) and single Python floats (a simulator pricing one
engine step at a time, where a numpy call on a scalar costs more than the arithmetic).
An argument that is a numpy array takes numpy's function; otherwise the builtin
comparison gives the same value. Inputs are counts and seconds, never NaN.
"""
from __future__ import annotations

import numpy as np


def maximum(a, b):
    """Elementwise ``max(a, b)`` (``np.maximum`` when either is an array)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a >= b else b


def clip(x, lo, hi):
    """``x`` limited to ``[lo, hi]`` (``np.clip`` when any is an array)."""
    if isinstance(x, np.ndarray) or isinstance(lo, np.ndarray) or isinstance(hi, np.ndarray):
        return np.clip(x, lo, hi)
    x = x if x >= lo else lo
    return x if x <= hi else hi


def where(condition, a, b):
    """``a`` where ``condition`` holds, else ``b`` (``np.where`` when any is an array)."""
    if isinstance(condition, np.ndarray) or isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.where(condition, a, b)
    return a if condition else b
