"""The chapter pages' figures (servebook.figures and the lab plots the pages reuse) draw exactly the
recorded or computed values, read back from the Axes and compared with the data files read here by
hand, label every axis with its unit, and keep their text at the page size.
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from servebook import figures as F  # noqa: E402
from servebook.lab.analyses.lab3_preemption import load_l3, plot_l3  # noqa: E402
from servebook.lab.analyses.lab5_chunked_prefill import l5_table  # noqa: E402
from servebook.lab.recordings.recorded import load_recorded, recorded_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs" / "results" / "labs"
STEPS = ROOT / "labs" / "results" / "step_timing" / "qwen3-32b.json"
UNITS = ("tokens/s", "count", "GiB", "TFLOP/s", "FLOP per byte", ", ms", "thousands", "ms per", "×", ", hours")


@pytest.fixture
def close_figures():
    yield
    plt.close("all")


def assert_page_figure(fig, categorical: str = ""):
    """Page width, every visible text at least 10 pt, every axis labelled; a numeric axis names its unit.

    ``categorical``: the axes ("x", "y" or both) whose ticks are names (models, configurations),
    which need a label (x) or tick names (y) but no unit.
    """
    w, h = fig.get_size_inches()
    assert 6.5 <= w <= 7.5 and h <= 4, (w, h)
    for ax in fig.axes:
        for axis, label in (("x", ax.get_xlabel()), ("y", ax.get_ylabel())):
            if axis in categorical:
                ticks = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
                assert label or all(t.get_text() for t in ticks), (axis, label)
            elif axis == "x" and not label:
                # A twin y axis shares its panel's x axis: the panel's other Axes must label it.
                assert any(o.get_xlabel() for o in fig.axes if o.get_position().bounds == ax.get_position().bounds)
            elif axis == "y" and not label:
                # A panel sharing its neighbour's y axis is labelled by the neighbour.
                assert any(o.get_ylabel() for o in ax.get_shared_y_axes().get_siblings(ax) if o is not ax), ax
            else:
                assert any(u in label for u in UNITS), (axis, label)
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts, *ax.get_xticklabels(), *ax.get_yticklabels()]
        if ax.get_legend():
            texts += ax.get_legend().get_texts()
        small = [(t.get_text(), t.get_fontsize()) for t in texts if t.get_text() and t.get_fontsize() < 10]
        assert not small, small


def test_recorded_on_names_the_gpu_count_in_words_and_the_version():
    doc = json.loads(STEPS.read_text())
    assert F.recorded_on(doc) == "one NVIDIA H200, vLLM 0.26.0"
    assert F.recorded_on({"gpu": {"name": "NVIDIA H200", "count": 2}, "vllm_version": "0.26.0"}) == \
        "two NVIDIA H200s, vLLM 0.26.0"


# ---- 6.9: Lab 3's sweep (plot_l3) -----------------------------------------------------------

def test_l3_plot_draws_the_recorded_sweep(close_figures):
    points = []
    for name in ("l3_preemption_16_48_gpu.json", "l3_preemption_128_256_gpu.json"):
        points += json.loads((LABS / name).read_text())["measurements"]["points"]
    fig = plot_l3(load_l3()["measurements"])
    assert_page_figure(fig, categorical="x")   # --max-num-seqs values as ticks
    ax, ax2 = fig.axes
    ax, ax2 = (ax, ax2) if ax.get_ylabel().startswith("output") else (ax2, ax)
    line = next(l for l in ax.lines if l.get_label() == "output tokens/s")
    assert [tuple(p) for p in line.get_xydata()] == [(p["max_num_seqs"], p["output_throughput"]) for p in points]
    assert [b.get_height() for b in ax2.patches] == [p["preemptions"] for p in points]
    # The knee by hand: 2048 blocks, each request ends at 512 + 128 tokens = 40 blocks of 16: 51.
    knee = next(l for l in ax.lines if "knee" in l.get_label())
    assert list(knee.get_xdata()) == [51, 51] and "(51)" in knee.get_label()
    assert ax.get_ylabel() == "output throughput, tokens/s" and ax2.get_ylabel() == "preemptions (count)"


# ---- 6.5: the memory claims -----------------------------------------------------------------

def test_memory_bar_stacks_the_budgets_claims_to_the_gpus_memory(close_figures):
    from servebook.hardware import get_gpu
    from servebook.hf_config import load_model_spec
    from servebook.memory import memory_budget

    gpu = get_gpu("H200")
    budgets = {name: memory_budget(load_model_spec(name), gpu_memory_bytes=gpu.memory_bytes,
                                   max_num_batched_tokens=8192, max_num_seqs=1024)
               for name in ("gemma-4-31b", "gemma-4-26b-a4b")}
    fig = F.plot_memory_claims(budgets)
    assert_page_figure(fig, categorical="y")
    [ax] = fig.axes
    assert ax.get_xlabel() == "memory of one GPU, GiB"
    bars = ax.patches
    assert len(bars) == 6 * len(budgets)
    for row, b in enumerate(budgets.values()):
        mine = bars[6 * row: 6 * row + 6]
        want = [b.weights_bytes, b.activation_bytes, b.non_torch_bytes, b.cudagraph_bytes, b.available_kv_bytes,
                b.total_memory_bytes - b.requested_bytes]
        assert [p.get_width() for p in mine] == pytest.approx([x / 2**30 for x in want], abs=1e-9)
        # Each segment starts where the previous ended, and the bar ends at the GPU's memory.
        assert [p.get_x() for p in mine[1:]] == pytest.approx([p.get_x() + p.get_width() for p in mine[:-1]])
        assert mine[-1].get_x() + mine[-1].get_width() == pytest.approx(gpu.memory_bytes / 2**30)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(F.CLAIM_COLOURS)


# ---- 6.4: roofline with the recorded steps ---------------------------------------------------

def test_roofline_places_each_recorded_step_at_model_flops_over_measured_time(close_figures):
    from servebook.hf_config import load_model_spec
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.roofline import decode_intensity, prefill_intensity

    result = json.loads(STEPS.read_text())["cases"][0]["result"]
    spec, g = load_model_spec("qwen3-32b"), gpu_numbers("H200")
    fig = F.plot_roofline_steps(spec, "H200", result["prefill"], result["decode"])
    assert_page_figure(fig)
    [ax] = fig.axes
    lines = {l.get_label(): l.get_xydata() for l in ax.lines}
    pre = lines["prefill steps (one prompt)"]
    assert len(pre) == len(result["prefill"]) == 6
    for (x, y), row in zip(pre, result["prefill"]):
        w = prefill_intensity(spec, [row["tokens"]])
        assert x == pytest.approx(float(w["intensity_flops_per_byte"][0]))
        assert y == pytest.approx(float(w["flops"][0]) / row["time_s"] / 1e12)
    dec = lines["decode steps (batch 1-256)"]
    assert len(dec) == len(result["decode"]) == 17
    for (x, y), row in zip(dec, result["decode"]):
        w = decode_intensity(spec, [row["batch"]], row["mean_context_tokens"])
        assert y == pytest.approx(float(w["flops"][0]) / row["step_s"] / 1e12)
    # Batch 1 by hand: about 2 FLOPs per parameter per token, over the measured 18.4 ms step.
    b1 = next(y for (x, y), row in zip(dec, result["decode"]) if row["batch"] == 1 and row["prompt_tokens"] == 512)
    assert 0.9 < b1 / (2 * spec.params.total / 0.018447808187501025 / 1e12) < 1.2
    # No step above the roof; the roof bends at the ridge, at the bf16 peak.
    roof = lines["roofline (bf16 peak, HBM bandwidth)"]
    assert tuple(roof[1]) == pytest.approx((g.ridge_flops_per_byte, g.bf16_dense_flops / 1e12))
    for x, y in [*pre, *dec]:
        assert y <= min(g.bf16_dense_flops, g.hbm_bandwidth_bytes_per_s * x) / 1e12


# ---- 6.11: Lab 5's TTFT against the worst gap ------------------------------------------------

def test_chunk_tradeoff_draws_lab5s_medians(close_figures):
    m = json.loads((LABS / "l5_chunked_prefill_gpu.json").read_text())["measurements"]
    doc = load_recorded(recorded_path("l5_chunked_prefill"), lab="l5_chunked_prefill")
    target = m["prediction"]["recommendation"]["target_step_s"] * 1e3
    fig = F.plot_chunk_tradeoff(l5_table(doc["measurements"]), target, m["measured_knee"])
    assert_page_figure(fig)
    [ax] = fig.axes
    lines = {l.get_label(): l for l in ax.lines}
    measured = lines["measured"].get_xydata().ravel().tolist()
    assert measured == pytest.approx([v for c in m["configs"] for v in (c["ttft_s"] * 1e3, c["worst_itl_s"] * 1e3)])
    # The prediction of each measured configuration, matched by chunking and budget.
    pred = {(c["chunked"], c["max_num_batched_tokens"]): c for c in m["prediction"]["configs"]}
    want = [pred[c["chunked"], c["max_num_batched_tokens"]] for c in m["configs"]]
    predicted = lines["predicted (step model)"].get_xydata().ravel().tolist()
    assert predicted == pytest.approx([v for c in want for v in (c["ttft_s"] * 1e3, c["worst_itl_s"] * 1e3)])
    assert list(lines[f"gap target ({target:.0f} ms)"].get_ydata()) == [target, target]
    # The ring sits on the measured point of the knee's budget (chunking on).
    [knee] = [c for c in m["configs"] if c["chunked"] and c["max_num_batched_tokens"] == m["measured_knee"]]
    ring = lines[f"measured knee ({m['measured_knee']:,})"].get_xydata().ravel().tolist()
    assert ring == pytest.approx([knee["ttft_s"] * 1e3, knee["worst_itl_s"] * 1e3])
    assert sorted(t.get_text() for t in ax.texts) == sorted(
        f"{c['max_num_batched_tokens']:,}" + ("" if c["chunked"] else " (chunking off)") for c in m["configs"])


# ---- 6.14: TP against replicas (Lab 9, Qwen3-32B) --------------------------------------------

def test_tp_vs_dp_draws_lab9s_logged_and_measured_values(close_figures):
    import re

    from servebook.hf_config import load_model_spec
    from servebook.lab.analyses.lab9_parallel import load_l9

    view = load_l9("qwen3-32b")
    fig = F.plot_tp_vs_dp(view, load_model_spec("qwen3-32b"))
    assert_page_figure(fig, categorical="x")
    kv, tpot, load = fig.axes
    configs = [t.get_text() for t in kv.get_xticklabels()]
    assert configs == ["TP=1", "DP=2", "TP=2"]
    logged_kv, tpot_ms, engine_rate = [], [], []
    for config in configs:
        [p] = [q for q in json.loads((LABS / view["files"][config]).read_text())["measurements"]["points"]
               if q["config"] == config]
        logged_kv.append(int(re.search(r"GPU KV cache size: ([\d,]+) tokens", p["logs"][0]).group(1).replace(",", "")))
        tpot_ms.append(p["light"]["summary"]["median_tpot_ms"])
        d = p["metrics_delta"]   # every request decodes in every step: requests / mean engine ITL
        n = sum(len(run["requests"]) for run in p["saturated"]["runs"])
        engine_rate.append(n / (d["vllm:inter_token_latency_seconds_sum"] / d["vllm:inter_token_latency_seconds_count"]))
    n = len(configs)
    assert [b.get_height() for b in kv.patches[:n]] == pytest.approx([t / 1e3 for t in logged_kv])
    assert [b.get_height() for b in tpot.patches[:n]] == pytest.approx(tpot_ms, abs=0.01)
    assert [b.get_height() for b in load.patches[:n]] == pytest.approx(engine_rate, abs=0.5)
    assert [t.get_text() for t in load.get_legend().get_texts()] == ["at the engines", "at the clients"]


# ---- 6.16: speculation's speed-up --------------------------------------------------------------

def test_speedup_panels_plot_the_step_models_prediction(close_figures):
    from servebook.hf_config import load_model_spec
    from servebook.perf import calibrated_coefficients, gpu_numbers
    from servebook.perf.speculative import expected_tokens_per_step, speculative_step

    gpu = gpu_numbers("H200")
    coeffs, _ = calibrated_coefficients(gpu.name)
    specs = {"dense": load_model_spec("gemma-4-31b"), "MoE": load_model_spec("gemma-4-26b-a4b")}
    batches = (1, 4, 16, 64)
    fig = F.plot_speculation_speedup(specs, gpu, coeffs, k=4, alphas=(0.5, 0.9), batches=batches,
                                     context_tokens=1024)
    assert_page_figure(fig, categorical="x")   # batch sizes as ticks
    assert fig.axes[0].get_ylabel() == "decode speed-up, × (k = 4)"
    for ax, (title, spec) in zip(fig.axes, specs.items()):
        assert ax.get_title() == title
        lines = {l.get_label(): l for l in ax.lines if l.get_label().startswith("α")}
        assert list(lines) == ["α = 50%", "α = 90%"]
        for alpha, line in zip((0.5, 0.9), lines.values()):
            assert list(line.get_xdata()) == list(batches)
            # speed-up = tokens per step (1 + α + ... + α^4, by hand) x plain step / verify step
            tokens = sum(alpha ** i for i in range(5))
            want = []
            for b in batches:
                s = speculative_step(spec, gpu, coeffs, k=4, alpha=alpha, batch=b, context_tokens=1024)
                assert s.draft_s == 0 and s.tokens_per_step == pytest.approx(tokens)
                want.append(tokens * s.plain_step_s / s.verify_s)
            assert list(line.get_ydata()) == pytest.approx(want)
    assert expected_tokens_per_step(4, 0.5) == pytest.approx(1.9375)


# ---- 6.15: MoE against dense decode steps ------------------------------------------------------

def test_moe_dense_steps_plot_the_recorded_steps_and_the_touched_experts(close_figures):
    from servebook.hf_config import load_model_spec

    def steps(name):
        doc = json.loads((STEPS.parent / f"{name}.json").read_text())
        return {e["batch"]: e["step_s"] for e in doc["cases"][0]["result"]["decode"] if e["prompt_tokens"] == 2048}

    moe, dense, spec = steps("qwen3-30b-a3b"), steps("qwen3-32b"), load_model_spec("qwen3-30b-a3b")
    fig = F.plot_moe_dense_steps(moe, dense, spec, ("A3B", "32B"))
    assert_page_figure(fig, categorical="x")   # batch sizes as ticks
    lines = {l.get_label(): l for ax in fig.axes for l in ax.lines}
    for label, rows in (("A3B step", moe), ("32B step", dense)):
        assert list(lines[label].get_xdata()) == sorted(rows), label
        assert list(lines[label].get_ydata()) == pytest.approx([s * 1e3 for _, s in sorted(rows.items())]), label
    # Touched experts by hand: E * (1 - (1 - k/E)^b) with E = 128 routed experts, top-8.
    e, k = spec.moe.num_experts, spec.moe.experts_per_token
    assert (e, k) == (128, 8)
    touched = lines["experts touched (A3B)"]
    assert list(touched.get_ydata()) == pytest.approx([e * (1 - (1 - k / e) ** b) for b in sorted(moe)])


# ---- 6.22: layouts of one job on eight GPUs --------------------------------------------------

def test_layout_hours_bars_are_the_fleet_plans_hours(close_figures):
    from servebook.hf_config import load_model_spec
    from servebook.perf import calibrated_coefficients, gpu_numbers
    from servebook.perf.fleet import Deployment, LengthDistribution, Workload, plan

    gpu = gpu_numbers("h100")
    coeffs, _ = calibrated_coefficients(gpu.name)
    moe = load_model_spec("gemma-4-26b-a4b")
    job = Workload(1_000_000, LengthDistribution.fixed(12_000), LengthDistribution.fixed(3_000))
    options = {(tp, kv): plan(job, Deployment.of(moe, gpu=gpu, gpus=8, name=f"tp{tp}-{kv}", tp=tp, kv_cache_dtype=kv,
                                              max_num_batched_tokens=16384, cudagraph_max_tokens=16384), coeffs)
               for tp in (1, 2, 8) for kv in ("auto", "fp8")}
    fig = F.plot_layout_hours(options)
    assert_page_figure(fig, categorical="x")   # layouts as ticks
    [ax] = fig.axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["bf16 KV cache", "fp8 KV cache"]
    bars = ax.patches
    # Bars in legend order (bf16 for TP 1, 2, 8, then fp8), each the plan's hours, its batch above it.
    keys = [(tp, kv) for kv in ("auto", "fp8") for tp in (1, 2, 8)]
    assert [b.get_height() for b in bars] == pytest.approx([options[k].hours for k in keys])
    assert [t.get_text() for t in ax.texts] == [f"{options[k].batch:,}" for k in keys]
    # Replicas = 8 GPUs / TP; the fastest layout alone is outlined.
    assert [t.get_text() for t in ax.get_xticklabels()] == ["TP 1\n(8 replicas)", "TP 2\n(4 replicas)",
                                                            "TP 8\n(1 replica)"]
    best = min(keys, key=lambda k: options[k].hours)
    assert [b.get_linewidth() == 2 for b in bars] == [k == best for k in keys]


# ---- 6.27: moving one prompt's KV cache ------------------------------------------------------

def test_kv_handoff_draws_the_prefill_and_each_transfer(close_figures):
    transfers = {"NVLink": 0.0024, "a 400 Gb/s port": 0.0215}
    fig = F.plot_kv_handoff(0.2126, transfers, prompt_label="8,192 tokens")
    assert_page_figure(fig, categorical="y")
    ax = fig.axes[0]
    assert [round(p.get_width(), 6) for p in ax.patches] == [212.6, 2.4, 21.5]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == "prefill of 8,192 tokens" and labels[1:] == ["move its KV: NVLink", "move its KV: a 400 Gb/s port"]


# ---- 6.23: Lab 8's tactics -----------------------------------------------------------------

def test_tactics_plot_draws_each_recorded_case_at_page_size(close_figures):
    from servebook.lab.analyses.lab8_batch_tactics import plot_tactics, recorded_tactics_path

    doc = json.loads(recorded_tactics_path().read_text())
    fig = plot_tactics(doc, title="")
    assert_page_figure(fig, categorical="y")
    (ax,) = fig.axes
    assert ax.get_title() == ""
    best = {c["name"]: max(r["output_tokens"] / r["wall_s"] for r in c["runs"]) for c in doc["cases"]}
    drawn = {t.get_text(): p.get_width() for t, p in zip(ax.get_yticklabels(), ax.patches)}
    assert drawn == pytest.approx(best)


# ---- 6.8: Lab 4's two pools (plot_l4) --------------------------------------------------------

def test_l4_plot_draws_the_recorded_pools_and_throughput_at_page_size(close_figures):
    from servebook.lab.analyses.lab4_fp8_kv import plot_l4

    m = json.loads((LABS / "l4_fp8_kv_gpu.json").read_text())["measurements"]
    fig = plot_l4(m)
    assert_page_figure(fig, categorical="x")       # --kv-cache-dtype values as ticks
    pools, tput = fig.axes
    dtypes = m["workload"]["kv_dtypes"]
    engine = [p.get_height() for p in pools.patches][len(dtypes):]
    assert engine == pytest.approx([m["engines"][d]["kv_cache_tokens"] / 1e3 for d in dtypes])
    assert [p.get_height() for p in tput.patches] == pytest.approx(
        [m["engines"][d]["bench"]["summary"]["output_throughput"] for d in dtypes])


def test_moe_dense_steps_draw_the_spread_of_the_repeats(close_figures):
    from servebook.hf_config import load_model_spec

    spec = load_model_spec("qwen3-30b-a3b")
    moe = {1: 0.004, 64: 0.021}
    dense = {1: 0.0186, 64: 0.0276}
    moe_samples = {1: [0.004, 0.0041, 0.0039], 64: [0.016, 0.021, 0.065]}
    fig = F.plot_moe_dense_steps(moe, dense, spec, ("A3B", "32B"), moe_samples=moe_samples)
    bars = [c for ax in fig.axes for c in ax.collections]
    spans = sorted(tuple(round(v, 3) for v in seg[:, 1]) for c in bars for seg in c.get_segments())
    # one bar per MoE batch, fastest to slowest repeat in ms; none for the dense model (no samples given)
    assert spans == [(3.9, 4.1), (16.0, 65.0)]
    assert fig.axes[0].get_ylim()[1] >= 65.0, "the slowest repeat stays inside the axes"
