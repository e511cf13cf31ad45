"""The mechanism diagrams (servebook.diagrams) draw the structure the library computes: counted back from the
drawn patches (by their gids) and lines, and compared with numbers worked out here by hand from the models'
config.json files and vLLM 0.27.1's rules, not with the library's output.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from servebook import diagrams as D  # noqa: E402
from servebook import load_model_spec, make_plan  # noqa: E402
from servebook.errors import ServebookError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "src" / "servebook" / "data" / "models"


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def gids(fig) -> list[str]:
    return [p.get_gid() for ax in fig.axes for p in ax.patches if p.get_gid()]


def count(fig, pattern: str) -> int:
    return sum(bool(re.fullmatch(pattern, g)) for g in gids(fig))


def assert_page_size(fig):
    """Page width, at most 4 inches tall, no visible text under 10 points."""
    w, h = fig.get_size_inches()
    assert 6.5 <= w <= 7.5 and h <= 4, (w, h)
    texts = list(fig.texts)
    for ax in fig.axes:
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts, *ax.get_xticklabels(), *ax.get_yticklabels()]
        if ax.get_legend():
            texts += ax.get_legend().get_texts()
    small = [(t.get_text(), t.get_fontsize()) for t in texts if t.get_text() and t.get_fontsize() < 10]
    assert not small, small


def text_config(name: str) -> dict:
    c = json.loads((MODELS / f"{name}.json").read_text())
    return c.get("text_config", c)


# ---- (a) block table and hybrid groups: Gemma 3 27B --------------------------------------------------

def test_block_table_and_groups_draw_gemma3s_seven_groups_and_their_blocks():
    cfg = text_config("gemma-3-27b")
    layers, window = cfg["num_hidden_layers"], cfg["sliding_window"]
    full = layers // 6                                  # one global layer in six: 10
    sliding = layers - full                             # 52, in groups of 10 (the full group's size): 6
    groups = 1 + -(-sliding // full)
    plan = make_plan("gemma-3-27b", gpu="H200")          # async scheduling on: 2 tokens unsettled per decode
    fig = D.plot_block_table_and_groups(plan.capacity.layout, request_tokens=2048, unsettled_tokens=2,
                                        table_tokens=88, pool_blocks=24)
    assert_page_size(fig)
    assert groups == 7
    rows = {int(re.match(r"g(\d+)-", g).group(1)) for g in gids(fig) if g.startswith("g")}
    assert rows == set(range(groups))
    # A 2,048-token request in 16-token blocks: 128 per group; the full group keeps them all, each sliding
    # group the window's worth plus the block it straddles: (1024 + 2 - 2) / 16 + 1 = 65.
    assert count(fig, r"g0-held") == 2048 // 16 and count(fig, r"g0-freed") == 0
    for k in range(1, groups):
        assert count(fig, rf"g{k}-held") == (window + 2 - 2) // 16 + 1
        assert count(fig, rf"g{k}-held") + count(fig, rf"g{k}-freed") == 2048 // 16
    labels = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    assert labels[0].startswith("full") and sum(l.startswith("sliding") for l in labels) == groups - 1
    # padding: 6 groups x 10 slots for 52 layers leave 8 padding layers
    assert sum(int(m.group(1)) for l in labels if (m := re.search(r"\+ (\d+) pad", l))) == 6 * full - sliding
    # The block table: 88 tokens fill 6 logical blocks, each mapped to its own physical block.
    assert count(fig, r"logical-\d+") == 6 and count(fig, r"physical-\d+") == 24
    left = fig.axes[0]
    used = [p for p in left.patches if (p.get_gid() or "").startswith("physical") and p.get_facecolor()[:3]
            == matplotlib.colors.to_rgb(D.HELD)]
    assert len(used) == 6


def test_block_table_refuses_a_request_larger_than_its_pool():
    plan = make_plan("llama-3.1-8b", gpu="H200")
    with pytest.raises(ServebookError, match="more than the pool"):
        D.plot_block_table_and_groups(plan.capacity.layout, request_tokens=64, unsettled_tokens=2,
                                      table_tokens=16 * 30, pool_blocks=24)


# ---- (b) a request's KV hold: Gemma 4 31B -------------------------------------------------------------

def test_kv_hold_draws_admission_prefill_transient_and_decode_plateau():
    cfg = text_config("gemma-4-31b")
    kinds = cfg["layer_types"]
    n_full, n_sliding = kinds.count("full_attention"), kinds.count("sliding_attention")
    # bytes per token of one layer, bf16, K and V: full 4 heads x 512, sliding 16 heads x 256
    full_tok = cfg["num_global_key_value_heads"] * cfg["global_head_dim"] * 2 * 2
    slide_tok = cfg["num_key_value_heads"] * cfg["head_dim"] * 2 * 2
    page = slide_tok * 16                                # sliding layers keep 16-token blocks ...
    full_block = page // full_tok                        # ... and full layers take as many tokens per page: 32
    group = n_full                                       # 10 layers a group; 50 sliding layers: 5 groups
    block_bytes = page * group
    sliding_groups = n_sliding // group
    plan = make_plan("gemma-4-31b", gpu="H200", max_model_len=16384)
    prompt, out, chunk = 12000, 4000, plan.max_num_batched_tokens
    assert chunk == 8192                                 # vllm serve's default on an H200
    s = D.kv_hold_series(plan.capacity.layout, prompt_tokens=prompt, output_tokens=out, chunk_tokens=chunk,
                         max_model_len=16384, in_flight_tokens=2 * chunk, async_scheduling=True)
    fig = D.plot_kv_hold(s, model_label="Gemma 4 31B")
    assert_page_size(fig)
    ax = fig.axes[0]
    lines = {l.get_label(): l for l in ax.lines}
    gib = 2**30
    sliding = lines["sliding-window: held"].get_ydata()
    full = lines["full-attention: held"].get_ydata()
    # decode plateau: (1024 + 2 - 2) / 16 + 1 blocks in each sliding group, whatever the context
    plateau = sliding_groups * ((1024 + 2 - 2) // 16 + 1) * block_bytes / gib
    assert sliding[-1] == pytest.approx(plateau) and sliding[-200] == pytest.approx(plateau)
    # the full group grows with the context: 16,000 tokens in 32-token blocks
    assert full[-1] == pytest.approx(-(-(prompt + out) // full_block) * block_bytes / gib)
    # prefill transient: the first chunk (8,192 tokens) is all held in every sliding group, above the plateau
    assert sliding[1] == pytest.approx(sliding_groups * 8192 // 16 * block_bytes / gib)
    assert max(sliding) > 5 * plateau
    # admission checks the whole prompt free in every group (12,000 tokens < the booking bound)
    dashed = {c.get_label(): c for c in ax.collections}
    seg = dashed["sliding-window: admission check"].get_segments()[0]
    assert seg[0][1] == pytest.approx(sliding_groups * -(-prompt // 16) * block_bytes / gib)
    assert seg[1][0] == prompt
    seg = dashed["full-attention: admission check"].get_segments()[0]
    assert seg[0][1] == pytest.approx(-(-prompt // full_block) * block_bytes / gib)


def test_kv_hold_refuses_a_request_longer_than_the_limit():
    plan = make_plan("gemma-4-31b", gpu="H200", max_model_len=16384)
    with pytest.raises(ServebookError, match="fits max_model_len"):
        D.kv_hold_series(plan.capacity.layout, prompt_tokens=16000, output_tokens=1000, chunk_tokens=8192,
                         max_model_len=16384, in_flight_tokens=16384, async_scheduling=True)


# ---- (c) async scheduling's timeline ------------------------------------------------------------------

def _bars(fig, mode: str, lane: str) -> dict[int, list[tuple[float, float]]]:
    out: dict[int, list] = {}
    for ax in fig.axes:
        for p in ax.patches:
            m = re.fullmatch(rf"{mode}-{lane}-(\d+)", p.get_gid() or "")
            if m:
                out.setdefault(int(m.group(1)), []).append((p.get_x(), p.get_x() + p.get_width()))
    return out


def test_async_timeline_overlaps_the_next_schedule_with_the_gpu_step():
    fig = D.plot_async_timeline(steps=4)
    assert_page_size(fig)
    for mode, ahead in (("sync", 1), ("async", 2)):      # vLLM: 2 batches in flight with async scheduling
        cpu, gpu = _bars(fig, mode, "cpu"), _bars(fig, mode, "gpu")
        assert sorted(gpu) == sorted(cpu) == [0, 1, 2, 3]
        spans = {n: (min(s for s, _ in bars), max(e for _, e in bars)) for n, bars in cpu.items()}
        instants = sorted({t for s, e in spans.values() for t in (s, e)})
        in_flight = max(sum(s <= t < e for s, e in spans.values()) for t in instants)
        assert in_flight == ahead, mode
        # each step's GPU work starts after its schedule ends
        assert all(gpu[n][0][0] >= min(e for _, e in cpu[n]) - 1e-9 for n in gpu)
        gaps = [gpu[n + 1][0][0] - gpu[n][0][1] for n in range(3)]
        if mode == "async":
            assert gaps == pytest.approx([0, 0, 0])    # the GPU never waits for the CPU
        else:
            assert min(gaps) > 0


# ---- (d) CUDA-graph regimes --------------------------------------------------------------------------

def test_graph_regimes_split_at_the_largest_captured_step():
    # vllm serve on an H200: 1,024 sequences, 8,192 tokens; capture limit min(1024 x 2, 512, 8192) = 512
    from servebook.vllm_rules.compilation import cudagraph_max_tokens

    capture = cudagraph_max_tokens(1024, 8192)
    assert capture == 512
    fig = D.plot_graph_regimes(capture, 8192, recorded={"full_graph": (300, 20.0), "eager": (900, 40.0)})
    assert_page_size(fig)
    ax = fig.axes[0]
    spans = {p.get_gid(): (p.get_x(), p.get_x() + p.get_width()) for p in ax.patches if p.get_gid()}
    assert spans["decode-full_graph"] == (1, 512) and spans["mixed-piecewise"] == (1, 512)
    assert spans["decode-eager"] == (512, 8192) and spans["mixed-eager"] == (512, 8192)
    marks = {l.get_gid(): l.get_xdata()[0] for l in ax.lines if l.get_gid()}
    assert marks == {"recorded-full_graph": 300, "recorded-eager": 900}
    with pytest.raises(ServebookError):
        D.plot_graph_regimes(9000, 8192)


# ---- (e) KV heads under TP ----------------------------------------------------------------------------

def test_kv_head_sharding_of_gemma4_moe_at_tp4_shards_sliding_and_replicates_global():
    cfg = text_config("gemma-4-26b-a4b")
    sliding_heads, global_heads, tp = cfg["num_key_value_heads"], cfg["num_global_key_value_heads"], 4
    assert (sliding_heads, global_heads) == (8, 2)
    fig = D.plot_kv_head_sharding(load_model_spec("gemma-4-26b-a4b"), tp, model_label="Gemma 4 26B-A4B")
    assert_page_size(fig)
    for kind, heads in (("sliding", sliding_heads), ("full", global_heads)):
        per_gpu = {r: count(fig, rf"{kind}-gpu{r}-head\d+") for r in range(tp)}
        per_head = {h: count(fig, rf"{kind}-gpu\d-head{h}") for h in range(heads)}
        assert per_gpu == {r: max(heads // tp, 1) for r in range(tp)}            # 2 each / 1 each
        assert per_head == {h: max(tp // heads, 1) for h in range(heads)}         # once each / on two GPUs
    # at TP 8 the 8 sliding heads are one per GPU, and each global head sits on four GPUs
    fig8 = D.plot_kv_head_sharding(load_model_spec("gemma-4-26b-a4b"), 8, model_label="x")
    assert {count(fig8, rf"full-gpu\d-head{h}") for h in range(2)} == {4}


# ---- (f) the speculative verify pass -------------------------------------------------------------------

def test_verify_pass_scores_k_plus_one_positions_and_emits_accepted_plus_one():
    from servebook.perf.speculative import expected_tokens_per_step

    k, alpha = 4, 0.7
    e = expected_tokens_per_step(k, alpha)
    assert e == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))            # 2.77 by hand
    fig = D.plot_verify_pass(k, 3, expected_tokens=e, alpha=alpha)
    assert_page_size(fig)
    for case, emitted in (("reject", 3), ("all", k + 1)):
        assert count(fig, rf"{case}-draft-\d") == k
        assert count(fig, rf"{case}-position-\d") == k + 1
        assert count(fig, rf"{case}-emit-\d") == emitted
    assert any("2.77 tokens" in t.get_text() for t in fig.texts)
    with pytest.raises(ServebookError):
        D.plot_verify_pass(k, 5, expected_tokens=e, alpha=alpha)
