"""Sums, means, percentiles and dot products of Python floats, without numpy.

The calculators a reader drives (plan, step model, fleet planner, speculation, chunk budget,
the simulator's step loop) run on the standard library alone, so that they also run where
numpy does not (a browser's Pyodide, a bare interpreter). Where they used to reduce a numpy
array, these functions give the same float, digit for digit:

* :func:`pairwise_sum` adds like ``numpy.sum`` / ``ndarray.sum`` of a float64 vector
  (numpy's pairwise summation: blocks of up to 128 summed in 8 interleaved partial sums,
  halves above that), and :func:`mean` like ``numpy.mean``;
* :func:`percentile` is ``numpy.percentile(values, q)`` with its default ``"linear"`` method
  (including numpy's way of interpolating between two order statistics).

:func:`dot` is the exception: ``numpy.dot`` of two float vectors calls the BLAS library
numpy was built with, whose order of additions (and fused multiply-adds) depends on the
CPU and the number of threads, so its last digits are not the same on every machine. ``dot``
returns the correctly rounded sum of the products (:func:`math.fsum`), the same everywhere.
Sums of whole numbers below 2**53 are exact in any order, so there all agree.

:func:`numpy_or_none` and :func:`require_numpy` are how the core modules treat numpy as
optional: arrays in, arrays out when numpy is installed; numbers in, numbers out always.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from servebook.errors import ServebookError

_PAIRWISE_BLOCK = 128  # numpy's PW_BLOCKSIZE


def pairwise_sum(values: Sequence[float]) -> float:
    """Sum of ``values`` (floats) in numpy's order: ``float(numpy.sum(numpy.asarray(values, float)))``."""
    a = values if isinstance(values, list) else list(values)
    return _pairwise(a, 0, len(a))


def _pairwise(a: list, lo: int, n: int) -> float:
    """numpy's ``pairwise_sum`` (numpy/_core/src/umath/loops_utils.h.src) of ``a[lo:lo + n]``."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= _PAIRWISE_BLOCK:
        r0, r1, r2, r3, r4, r5, r6, r7 = a[lo:lo + 8]
        i = lo + 8
        end = lo + n - n % 8
        while i < end:
            r0 += a[i]
            r1 += a[i + 1]
            r2 += a[i + 2]
            r3 += a[i + 3]
            r4 += a[i + 4]
            r5 += a[i + 5]
            r6 += a[i + 6]
            r7 += a[i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for j in range(end, lo + n):
            res += a[j]
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(a, lo, n2) + _pairwise(a, lo + n2, n - n2)


def mean(values: Sequence[float]) -> float:
    """Mean of ``values`` as ``numpy.mean`` computes it (:func:`pairwise_sum` over the count)."""
    a = [float(v) for v in values]
    if not a:
        raise ServebookError("the mean of no values is undefined; give at least one value")
    return pairwise_sum(a) / len(a)


def percentile(values: Sequence[float], q: float) -> float:
    """``numpy.percentile(values, q)`` (method ``"linear"``) of finite floats; ``q`` in percent (0-100)."""
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ServebookError("the percentile of no values is undefined; give at least one value")
    if not 0 <= q <= 100:
        raise ServebookError(f"percentile {q} is outside 0-100")
    n = len(xs)
    virtual = (n - 1) * (q / 100)
    if virtual >= n - 1:
        return xs[-1]
    below = math.floor(virtual)
    a, b = xs[below], xs[below + 1]
    t = virtual - below
    diff = b - a
    # numpy's _lerp: from the nearer end, so that t = 0 and t = 1 give a and b exactly
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def dot(weights: Sequence[float], values: Sequence[float]) -> float:
    """``sum(w x v)``, correctly rounded (:func:`math.fsum` of the products); see the module docstring."""
    if len(weights) != len(values):
        raise ServebookError(f"dot product of {len(weights)} weights and {len(values)} values")
    return math.fsum(w * v for w, v in zip(weights, values))


def numpy_or_none():
    """The numpy module if it is already imported, else None (then no argument can be a numpy array)."""
    return sys.modules.get("numpy")


def require_numpy(what: str):
    """Import numpy for ``what`` (arrays, sweeps), or say plainly that it needs numpy."""
    try:
        import numpy
    except ImportError as exc:
        raise ServebookError(f"{what} needs numpy (pip install numpy); the calculators on single "
                             "numbers run without it") from exc
    return numpy


def is_number(x) -> bool:
    """True for a Python or numpy scalar (int, float, numpy.float64, numpy.int64, ...), not for a sequence or array."""
    if isinstance(x, (int, float)):
        return True
    np = numpy_or_none()
    return np is not None and isinstance(x, np.generic)


def as_floats(x) -> list[float]:
    """A number, sequence or numpy array of numbers as a list of Python floats (``numpy.atleast_1d``)."""
    if is_number(x):
        return [float(x)]
    if hasattr(x, "tolist"):
        x = x.tolist()
        if not isinstance(x, list):
            return [float(x)]
    return [float(v) for v in x]
