"""Calibration, stage zero: how efficiently vLLM's fused-MoE kernels run a routed expert's GEMMs.

A routed expert sees only the tokens routed to it (rows), and its GEMMs are as wide as its FFN
(``expert_gemm_size``: the intermediate size on one GPU). Both limit the kernel: few rows fill few
tiles' worth of rows, a narrow expert gives few tiles and a short inner loop. The step model prices
the expert GEMMs at ``expert_matmul_peak_eff x rows / (rows + expert_half_rows) x size / (size +
expert_half_size)`` of the GPU's bf16 peak (:mod:`servebook.perf.model`).

The shape of that curve -- ``expert_half_rows`` and ``expert_half_size`` -- is fitted here on timings
of the kernel alone (``labs/results/moe_kernels``, schema ``servebook.moe_kernel_timing/1``, recorded
by ``labs/tools/moe_kernel_timing.py``): one MoE layer's ``fused_experts`` over a grid of expert
shapes and token counts, routing uniform as the step model assumes. A point's time is modelled as
``smoothmax(expert bytes / (BW x bandwidth_eff), expert FLOPs / (FLOPS x eff(rows, size))) +
launch_s``. The kernel's own peak, ``bandwidth_eff`` and ``launch_s`` are fitted alongside and
reported, not handed on: stage one fits ``expert_matmul_peak_eff``, the expert bandwidth and the
per-MoE-layer cost on whole engine steps, where the layer also routes, sorts and gathers tokens (a
kernel peak imposed there pushes the step fit's other terms, dense ones included, to absorb what the
kernel alone does not show). The smooth maximum's exponent is held at :data:`SMOOTHMAX_P`, a
near-hard maximum: left free, a soft maximum trades the row term against the bandwidth term and the
fitted half rows stop meaning what the step model's do.

Left out of the fit, and reported as held out: shapes of the models the record lists as
``held_out`` (their engines test the step model) and shapes without a tuned vLLM configuration for
the GPU (vLLM then runs default block sizes, a different kernel configuration).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from servebook.errors import ServebookError
from servebook.records import results_path

SCHEMA = "servebook.moe_kernel_timing/1"
DEFAULT_DIR = results_path("moe_kernels")
#: The coefficients this stage fits and stage one then keeps.
FITTED = ("expert_half_rows", "expert_half_size")
#: Exponent of the smooth maximum between the kernel's read time and compute time (near a hard maximum;
#: the step model's own exponent, fitted in stage one, sits at the same bound on the H200 data).
SMOOTHMAX_P = 20.0
#: Loss of the fit: soft-L1 on the log error with this scale (a few outlying points must not steer it).
LOSS_SCALE = 0.1


def read_records(directory: str | Path | None = DEFAULT_DIR) -> list[tuple[Path, dict]]:
    """The kernel-timing records under ``directory`` (none when it is None or absent), validated."""
    if directory is None or not Path(directory).is_dir():
        return []
    out = []
    for p in sorted(Path(directory).glob("*.json")):
        try:
            doc = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ServebookError(f"cannot read kernel-timing record {p}: {exc}") from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise ServebookError(f"{p}: schema is {doc.get('schema') if isinstance(doc, dict) else None!r}, "
                                 f"expected {SCHEMA!r}")
        for key in ("gpu", "vllm_version", "shapes"):
            if key not in doc:
                raise ServebookError(f"{p}: missing {key!r}")
        out.append((p, doc))
    return out


def shape_role(shape: dict, held_out_models) -> str:
    """``"fit"``, ``"held out"`` (a held-out model's shape, or a share of it) or ``"untuned"``."""
    if any(shape["label"] == m or shape["label"].startswith(m + "-") for m in held_out_models):
        return "held out"
    if not shape.get("tuned_config_file"):
        return "untuned"
    return "fit"


def kernel_points(doc: dict) -> list[dict]:
    """One row per timed point: the shape, its role, tokens, rows per expert, FLOPs, bytes, seconds.

    Rows per touched expert and distinct experts follow the step model's uniform-routing
    expectation (:func:`servebook.perf.work.uniform_distinct_experts`), so a fitted efficiency
    means the same thing in both places.
    """
    from servebook.perf.work import uniform_distinct_experts

    held = doc.get("held_out") or []
    out = []
    for shape in doc["shapes"]:
        E, N, H, k = (int(shape[f]) for f in ("experts", "intermediate_size", "hidden_size", "top_k"))
        role = shape_role(shape, held)
        for p in shape.get("points") or []:
            t_s = p.get("seconds_per_layer")
            if not t_s or t_s <= 0:
                continue
            T = int(p["tokens"])
            distinct = uniform_distinct_experts(E, k, T)
            out.append({"label": shape["label"], "role": role, "tokens": T, "size": float(N),
                        "rows": T * k / distinct, "flops": 2.0 * T * k * 3 * N * H,
                        "bytes": distinct * 3 * N * H * 2.0, "seconds": float(t_s)})
    return out


def point_arrays(points: list[dict]) -> dict:
    """The numeric columns of :func:`kernel_points` rows as float arrays (what :func:`kernel_seconds` takes)."""
    import numpy as np

    return {k: np.array([p[k] for p in points], dtype=float) for k in ("rows", "size", "flops", "bytes", "seconds")}


def kernel_seconds(x, pts: dict, bw: float, flops: float):
    """Seconds per layer the kernel model gives points ``pts`` (:func:`point_arrays`) on a GPU of ``bw``
    bytes/s and ``flops`` bf16 FLOP/s, with ``x`` = (kernel peak efficiency, half rows, half width,
    bandwidth efficiency, launch seconds): the model this stage fits."""
    import numpy as np

    peak, half_rows, half_size, bw_eff, launch_s = x
    p = SMOOTHMAX_P
    rows, size = pts["rows"], pts["size"]
    eff = peak * rows / (rows + half_rows) * size / (size + half_size)
    compute = pts["flops"] / (flops * eff)
    read = pts["bytes"] / (bw * bw_eff)
    m = np.maximum(compute, read)
    return m * ((compute / m) ** p + (read / m) ** p) ** (1.0 / p) + launch_s


def fit(points: list[dict], gpu) -> dict:
    """Fit the kernel model to the ``fit`` points; report its error on every role.

    Returns ``coefficients`` (:data:`FITTED`), ``nuisance`` (the kernel's own peak efficiency, its
    bandwidth efficiency, launch seconds, and the smooth-maximum exponent it held) and ``report``: per
    role and per shape the mean absolute error and the worst error (fractions, predicted / measured - 1).
    """
    import numpy as np
    from scipy.optimize import least_squares

    from servebook.perf.gpu import gpu_numbers

    g = gpu_numbers(gpu)
    fit_pts = [p for p in points if p["role"] == "fit"]
    if len({p["label"] for p in fit_pts}) < 2:
        raise ServebookError("the expert-kernel fit needs timings of at least two tuned expert shapes that no "
                             "held-out model uses; record them with labs/tools/moe_kernel_timing.py")

    a = point_arrays(fit_pts)
    bw, peak_flops = g.hbm_bandwidth_bytes_per_s, g.bf16_dense_flops

    def residuals(z):
        r = np.log(kernel_seconds(np.exp(z), a, bw, peak_flops)) - np.log(a["seconds"])
        s = LOSS_SCALE
        return np.sign(r) * s * np.sqrt(2.0 * (np.sqrt(1.0 + (r / s) ** 2) - 1.0))

    #            peak  half_rows half_size bw_eff launch_s
    lo = np.log([0.05, 1.0, 1.0, 0.05, 1e-7])
    hi = np.log([1.0, 1e4, 1e5, 1.0, 1e-3])
    x0 = np.log([0.5, 100.0, 200.0, 0.8, 1e-5])
    res = least_squares(residuals, x0, bounds=(lo, hi), max_nfev=5000)
    x = np.exp(res.x)

    def errors(pts):
        b = point_arrays(pts)
        return kernel_seconds(x, b, bw, peak_flops) / b["seconds"] - 1.0

    report: dict = {"by_role": {}, "by_shape": {}}
    for role in ("fit", "held out", "untuned"):
        pts = [p for p in points if p["role"] == role]
        if pts:
            e = errors(pts)
            report["by_role"][role] = {"points": len(pts), "shapes": sorted({p["label"] for p in pts}),
                                       "mae": float(np.mean(np.abs(e))), "worst": float(e[np.argmax(np.abs(e))])}
    for label in dict.fromkeys(p["label"] for p in points):
        pts = [p for p in points if p["label"] == label]
        e = errors(pts)
        report["by_shape"][label] = {"role": pts[0]["role"], "mae": float(np.mean(np.abs(e))),
                                     "worst": float(e[np.argmax(np.abs(e))])}
    return {"coefficients": {"expert_half_rows": float(x[1]), "expert_half_size": float(x[2])},
            "nuisance": {"kernel_peak_eff": float(x[0]), "bandwidth_eff": float(x[3]), "launch_s": float(x[4]),
                         "smoothmax_p": SMOOTHMAX_P},
            "report": report}


def sources(paths_docs, root: Path) -> list[dict]:
    """Provenance of the records a fit read: file, sha256, GPU, vLLM version, date, held-out models."""
    out = []
    for p, doc in paths_docs:
        rel = str(p.relative_to(root)) if p.is_relative_to(root) else str(p)
        out.append({"file": rel, "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
                    "gpu": (doc.get("gpu") or {}).get("name"), "vllm_version": doc.get("vllm_version"),
                    "date": doc.get("date"), "held_out": doc.get("held_out") or []})
    return out
