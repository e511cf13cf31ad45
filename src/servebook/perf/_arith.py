"""The few non-arithmetic operations of the perf formulas, for Python floats and numpy arrays alike.

The step-time formulas (:mod:`servebook.perf.work`, :mod:`servebook.perf.model`) are
written once, with ``+ - * / **`` and these helpers, so that the same code evaluates
whole arrays (calibration, sweeps) and single Python floats (a simulator pricing one
engine step at a time, a page in a browser without numpy). An argument that is a numpy
array takes numpy's function; otherwise the builtin comparison gives the same value.
numpy is never imported here: when it has not been imported, no argument can be an
array. Inputs are counts and seconds, never NaN.
"""
from __future__ import annotations

from servebook.reductions import numpy_or_none


_SCALARS = (float, int)


def _any_array(*xs):
    """numpy when one of ``xs`` is a numpy array, else None."""
    np = numpy_or_none()
    if np is not None:
        for x in xs:
            if isinstance(x, np.ndarray):
                return np
    return None


def maximum(a, b):
    """Elementwise ``max(a, b)`` (``np.maximum`` when either is an array)."""
    if type(a) in _SCALARS and type(b) in _SCALARS:  # the simulator's case, once per term of every step
        return a if a >= b else b
    np = _any_array(a, b)
    if np is not None:
        return np.maximum(a, b)
    return a if a >= b else b


def clip(x, lo, hi):
    """``x`` limited to ``[lo, hi]`` (``np.clip`` when any is an array)."""
    np = _any_array(x, lo, hi)
    if np is not None:
        return np.clip(x, lo, hi)
    x = x if x >= lo else lo
    return x if x <= hi else hi


def where(condition, a, b):
    """``a`` where ``condition`` holds, else ``b`` (``np.where`` when any is an array)."""
    np = _any_array(condition, a, b)
    if np is not None:
        return np.where(condition, a, b)
    return a if condition else b
