"""Stage zero of the calibration: the routed-expert GEMM efficiency, fitted on fused-MoE kernel timings.

The fit must give back known coefficients from timings made by the same formula, leave the held-out
models' shapes (and shapes vLLM has no tuned configuration for) out, and the shipped calibration must
say which kernel records it read and keep their values through the later stages.
"""
import hashlib
import json
from pathlib import Path

import pytest

from servebook.errors import ServebookError
from servebook.perf import calibrate_experts as ce
from servebook.perf.gpu import gpu_numbers
from servebook.perf.model import CALIBRATION_FILE

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "labs" / "results" / "moe_kernels"
TRUTH = {"peak": 0.55, "half_rows": 60.0, "half_size": 300.0, "bw_eff": 0.85, "launch_s": 2e-5}


def _timed(E, N, H, k, T):
    """Seconds per layer by the stage's own kernel model with TRUTH (what a perfect kernel record holds)."""
    import numpy as np

    g = gpu_numbers("h200")
    distinct = E * (1 - (1 - k / E) ** T)
    rows = T * k / distinct
    pts = {"rows": np.array([rows]), "size": np.array([float(N)]), "flops": np.array([2.0 * T * k * 3 * N * H]),
           "bytes": np.array([distinct * 3 * N * H * 2.0])}
    x = [TRUTH[k_] for k_ in ("peak", "half_rows", "half_size", "bw_eff", "launch_s")]
    return float(ce.kernel_seconds(x, pts, g.hbm_bandwidth_bytes_per_s, g.bf16_dense_flops)[0])


def _record(shapes, held_out=("big",)):
    tokens = [1, 4, 16, 64, 256, 1024, 4096, 16384]
    return {"schema": ce.SCHEMA, "gpu": {"name": "NVIDIA H200"}, "vllm_version": "0.26.0", "held_out": list(held_out),
            "shapes": [{"label": label, "experts": E, "intermediate_size": N, "hidden_size": H, "top_k": k,
                        "tuned_config_file": None if label.startswith("untuned") else "E=..json",
                        "points": [{"tokens": T, "seconds_per_layer": _timed(E, N, H, k, T)} for T in tokens]}
                       for label, E, N, H, k in shapes]}


SHAPES = [("small", 128, 256, 2048, 8), ("mid", 64, 1024, 3584, 8), ("wide", 8, 4096, 4096, 2),
          ("big", 8, 14336, 4096, 2), ("big-tp2", 8, 7168, 4096, 2), ("untuned-x", 64, 1408, 2048, 6)]


def test_roles_leave_held_out_models_and_their_shares_and_untuned_shapes_out():
    roles = {p["label"]: p["role"] for p in ce.kernel_points(_record(SHAPES))}
    assert roles == {"small": "fit", "mid": "fit", "wide": "fit", "big": "held out", "big-tp2": "held out",
                     "untuned-x": "untuned"}
    # a label that merely starts with a held-out name's letters is not its share
    assert ce.shape_role({"label": "bigger", "tuned_config_file": "f"}, ["big"]) == "fit"


def test_fit_recovers_known_coefficients_and_predicts_the_held_out_shapes():
    out = ce.fit(ce.kernel_points(_record(SHAPES)), "h200")
    c = out["coefficients"]
    assert set(c) == set(ce.FITTED) == {"expert_half_rows", "expert_half_size"}
    assert out["nuisance"]["kernel_peak_eff"] == pytest.approx(TRUTH["peak"], rel=0.02)
    assert c["expert_half_rows"] == pytest.approx(TRUTH["half_rows"], rel=0.05)
    assert c["expert_half_size"] == pytest.approx(TRUTH["half_size"], rel=0.05)
    assert out["nuisance"]["bandwidth_eff"] == pytest.approx(TRUTH["bw_eff"], rel=0.02)
    assert out["report"]["by_role"]["held out"]["mae"] < 0.01
    assert out["report"]["by_role"]["fit"]["shapes"] == ["mid", "small", "wide"]


def test_fit_needs_two_tuned_shapes_that_no_held_out_model_uses():
    with pytest.raises(ServebookError, match="at least two tuned expert shapes"):
        ce.fit(ce.kernel_points(_record(SHAPES[:1] + SHAPES[3:])), "h200")


def test_a_record_of_another_schema_is_refused(tmp_path):
    (tmp_path / "k.json").write_text(json.dumps({"schema": "servebook.step_timing/1"}))
    with pytest.raises(ServebookError, match="moe_kernel_timing"):
        ce.read_records(tmp_path)
    (tmp_path / "k.json").write_text("{not json")
    with pytest.raises(ServebookError, match="cannot read"):
        ce.read_records(tmp_path)


def test_shipped_stage_zero_read_exactly_the_kernel_records_and_later_stages_keep_its_values():
    """calibration.json names each kernel record with its sha256; the half rows and half width it fitted
    are the shipped coefficients; the held-out models' shapes were not fitted on."""
    shipped = json.loads(CALIBRATION_FILE.read_text())
    files = {s["file"]: s["sha256"] for s in shipped["stage0"]["sources"]}
    expected = {str(f.relative_to(ROOT)): hashlib.sha256(f.read_bytes()).hexdigest()
                for f in sorted(KERNELS.glob("*.json"))}
    assert expected and files == expected, "rerun python -m servebook.perf.calibrate"
    for gpu, report in shipped["stage0"]["report"].items():
        coeffs = shipped["coefficients"][gpu]
        for name in ce.FITTED:
            assert coeffs[name] == report["coefficients"][name], name
        # the recorded held-out shapes (Mixtral-8x7B, Qwen2-57B-A14B and their TP shares) were not fitted on
        held = report["report"]["by_role"]["held out"]
        assert {"mixtral-8x7b", "qwen2-57b-a14b"} <= set(held["shapes"])
        assert not set(held["shapes"]) & set(report["report"]["by_role"]["fit"]["shapes"])


def test_recorded_kernel_timings_show_wider_experts_run_nearer_the_peak():
    """The recorded fact the size term stands on: at the same rows per expert (512), the widest tuned
    expert shape reaches a higher fraction of the bf16 peak than the narrowest."""
    docs = ce.read_records(KERNELS)
    assert docs, "labs/results/moe_kernels holds the H200 record"
    g = gpu_numbers("h200")
    by_size = {}
    for _, doc in docs:
        for p in ce.kernel_points(doc):
            if p["role"] != "untuned" and abs(p["rows"] - 512) / 512 < 0.05:
                by_size[p["size"]] = p["flops"] / p["seconds"] / g.bf16_dense_flops
    assert len(by_size) >= 4
    assert by_size[max(by_size)] > 1.5 * by_size[min(by_size)]
