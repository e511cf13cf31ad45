"""Interview drills (page 6.26): data, computed answers, grading, rendering, CLI.

Numeric answers are recomputed for every variant and checked against the drill's tolerance
(accepts the computed value, rejects half and double: the K-and-V slip). Where an answer can be
derived independently, the test derives it: hand arithmetic from published shapes and
datasheets, or the figure a recorded engine log / /metrics snapshot / bench result printed.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from servebook.cli import main as cli_main
from servebook.drills import (KINDS, SECTIONS, DrillError, check_answer, get_drill, load_drills, parse_number,
                              question_html, render_html, render_markdown, render_section)
from servebook.drills import calls
from servebook.errors import ServebookError
from servebook.shipped import BENCH_DIR, STARTUP_LOGS_DIR

ROOT = Path(__file__).resolve().parents[1]
DRILLS = load_drills()
NUMERIC = [d for d in DRILLS if d.numeric]
BENCH = BENCH_DIR / "cpu-tiny-llama-preempt"
LOGS = STARTUP_LOGS_DIR   # the shipped H200 start-ups
GIB = 2**30


# ------------------------------------------------------------------ the data

def test_at_least_forty_drills_covering_every_section_and_kind():
    assert len(DRILLS) >= 40
    covered = {d.section for d in DRILLS}
    assert covered == set(SECTIONS) and len(SECTIONS) == 25
    assert {d.kind for d in DRILLS} == set(KINDS)
    assert len({d.id for d in DRILLS}) == len(DRILLS)


def test_debugging_drills_show_recorded_material():
    debugging = [d for d in DRILLS if d.kind == "debugging"]
    assert len(debugging) >= 5
    sources = {d.exhibit.source for d in debugging if d.exhibit}
    assert {"startup_log", "capture", "step_timing", "lab"} <= sources
    files = {d.exhibit.file for d in debugging if d.exhibit and d.exhibit.source == "capture"}
    assert {"metrics_after.txt", "bench_stdout.txt"} <= files  # a /metrics snapshot and a bench result


def test_every_exhibit_line_is_in_its_recorded_file():
    for d in DRILLS:
        if d.exhibit is None:
            continue
        raw = "\n".join(f.read_text(errors="replace") for f in d.exhibit.recorded_files())
        for line in d.exhibit.lines():
            shown = line.removesuffix(" ...")
            assert shown in raw or shown in raw.replace("\\n", "\n"), (d.id, line[:80])


def test_no_exhibit_or_caption_names_a_path_of_the_recording_machine():
    """Exhibits show what was measured, not where: no temporary folder (a model served from
    tempfile.mkdtemp used to appear in every /metrics label) and no core count of the CI machine."""
    shown = [(d.id, d.exhibit.caption + "\n" + d.exhibit.text()) for d in DRILLS if d.exhibit is not None]
    assert shown
    for drill_id, text in shown:
        assert "/tmp/" not in text and "servebook-lab-model-" not in text, drill_id
        assert "2-core" not in text, drill_id


def test_flags_and_metrics_named_by_drills_are_checked_claims():
    from test_book_claims import load_claims, unknown_names

    assert unknown_names([ROOT / "src" / "servebook" / "data" / "drills.toml"], load_claims()) == []


# ------------------------------------------------------------------ every numeric variant

@pytest.mark.parametrize("drill", NUMERIC, ids=[d.id for d in NUMERIC])
def test_every_variant_is_computed_and_the_tolerance_rejects_a_factor_of_two(drill):
    combos = drill.variant_args()
    assert len(combos) >= drill.num_variants  # every combination, plus the base question
    for args in combos:
        value = drill.compute(args)
        assert math.isfinite(value) and value > 0, (drill.id, args, value)
        assert drill.is_accepted(value, expected=value)
        assert not drill.is_accepted(2 * value, expected=value), (drill.id, args)
        assert not drill.is_accepted(value / 2, expected=value), (drill.id, args)
    for seed in range(6):  # seeds pick among those combinations
        assert drill.args_for(seed) in combos


def test_seed_zero_is_the_base_question_and_seeds_are_reproducible():
    d = get_drill("memory-kv-per-sequence")
    assert d.args_for(0) == d.args
    assert d.args_for(7) == d.args_for(7)
    assert len({tuple(sorted(d.args_for(s).items())) for s in range(1, 40)}) > 3
    with pytest.raises(DrillError, match="seed"):
        d.args_for(-1)


# ------------------------------------------------------------------ answers derived independently

def _arg(drill_id, **args):
    return get_drill(drill_id).compute({**get_drill(drill_id).args, **args})


def test_kv_answers_match_hand_arithmetic():
    # Llama-3.1-8B config: 32 layers, 8 KV heads, head_dim 128; bf16 = 2 bytes; K and V.
    per_token = 2 * 32 * 8 * 128 * 2
    assert _arg("memory-kv-per-token", model="llama-3.1-8b") == per_token / 1024
    assert _arg("memory-kv-per-sequence", model="llama-3.1-8b", context=32768) == pytest.approx(per_token * 32768 / GIB)
    assert _arg("kv-dtype-fp8-sequence", model="llama-3.1-8b", context=32768) == pytest.approx(per_token / 2 * 32768 / GIB)
    # Llama-3.1-70B: 80 layers, 8 KV heads x 128; TP 4 gives each GPU 2 heads.
    assert _arg("tp-kv-per-gpu", tp=4, context=32768) == pytest.approx(2 * 80 * 2 * 128 * 2 * 32768 / GIB)
    # Gemma 4 31B global layers: 4 KV heads; TP 2 splits them, TP 8 replicates (at least one per GPU).
    assert _arg("tp-kv-replication", tp=2) == 2 and _arg("tp-kv-replication", tp=8) == 1


def test_paging_batching_and_speculation_answers_match_hand_arithmetic():
    assert _arg("paged-contiguous-waste", used_tokens=200) == pytest.approx(100 * 29800 / 30000)
    assert _arg("paged-last-block-waste", tokens=1234) == 78 * 16 - 1234
    assert get_drill("batching-static-utilisation").expected() == pytest.approx(100 * (7 * 50 + 2000) / (8 * 2000))
    assert _arg("prefix-cache-full-blocks", shared_prefix_tokens=1000) == 62 * 16
    assert _arg("acceptance-compounds", k=4, alpha=0.7) == pytest.approx(100 * 0.7**4)
    assert _arg("spec-expected-tokens", k=4, alpha=0.7) == pytest.approx(1 + 0.7 + 0.49 + 0.343 + 0.2401)
    # vLLM 0.27.1 captures graphs up to min(2 x max_num_seqs, 512) tokens by default.
    assert _arg("cuda-graph-largest-step", max_num_seqs=1024) == 512
    assert _arg("cuda-graph-largest-step", max_num_seqs=16) == 32


def test_weight_read_and_measured_bandwidth_match_datasheets():
    # Llama-3.1-8B: 8.03e9 parameters (Meta's model card) x 2 bytes; H100 SXM 3.35 TB/s, H200 4.8 TB/s.
    weights = 8.03e9 * 2
    assert _arg("engine-weight-read-floor", model="llama-3.1-8b", gpu="H100") == pytest.approx(weights / 3.35e12 * 1e3, rel=0.01)
    step_s = 0.004962644218750256  # "decode B=1 C=512: 4.96 ms" in the recorded H200 log
    assert get_drill("phases-measured-bandwidth").expected() == pytest.approx(100 * weights / step_s / 4.8e12, rel=0.01)


def test_default_utilization_reserve_uses_the_pinned_default():
    source = ROOT / ".venv-vllm/lib/python3.11/site-packages/vllm/config/cache.py"
    if source.exists():  # read the pinned release itself when it is installed
        default = float(re.search(r"gpu_memory_utilization: float = Field\(default=([0-9.]+)", source.read_text()).group(1))
    else:
        default = 0.92  # vLLM 0.27.1 vllm/config/cache.py
    from servebook.hardware import get_gpu

    assert _arg("defaults-gpu-util-value", gpu="H200") == pytest.approx(get_gpu("H200").memory_bytes * (1 - default) / GIB)


def test_start_up_log_drills_agree_with_what_the_engine_printed():
    # The memory line's own figures leave what the log calls Available KV cache memory (2-decimal rounding).
    log = (LOGS / "h200-0.26.0-gemma-3-27b--eager" / "startup.log").read_text()
    available = float(re.search(r"Available KV cache memory: ([0-9.]+) GiB", log).group(1))
    assert get_drill("utilization-decompose-log").expected() == pytest.approx(available, abs=0.02)
    # fp8 run: predicted 'GPU KV cache size' from config + flags + logged budget, within the log's rounding.
    log = (LOGS / "h200-0.26.0-llama-3.1-8b--fp8kv" / "startup.log").read_text()
    tokens = int(re.search(r"GPU KV cache size: ([0-9,]+) tokens", log).group(1).replace(",", ""))
    assert get_drill("kv-dtype-fp8-log").expected() == pytest.approx(tokens, rel=0.005)
    # Gemma-3-27B padding warning: "Add 8 padding layers".
    padding = int(re.search(r"Add (\d+) padding layers", (LOGS / "h200-0.26.0-gemma-3-27b--eager" / "startup.log").read_text()).group(1))
    assert calls.predicted_padding_layers("h200-0.26.0-gemma-3-27b--eager") == padding


def test_metrics_and_bench_drills_agree_with_the_recorded_text():
    after = (BENCH / "metrics_after.txt").read_text()
    before = (BENCH / "metrics_before.txt").read_text()
    counter = re.compile(r"^vllm:num_preemptions_total\{[^}]*\} ([0-9.e+]+)$", re.M)
    assert float(counter.search(before).group(1)) == 0
    preemptions = float(counter.search(after).group(1))
    assert preemptions > 0 and get_drill("max-num-seqs-metrics-preemption").expected() == preemptions
    stdout = (BENCH / "bench_stdout.txt").read_text()
    p99 = float(re.search(r"P99 ITL \(ms\):\s+([0-9.]+)", stdout).group(1))
    median = float(re.search(r"Median ITL \(ms\):\s+([0-9.]+)", stdout).group(1))
    assert get_drill("chunked-prefill-bench-tail").expected() == pytest.approx(p99 / median, rel=0.01)
    # 6 blocks of 128 tokens; the server log's own concurrency for 512-token requests (4 blocks) is 1.50x.
    server = (BENCH / "server.log").read_text()
    assert "num_gpu_blocks_override=6" in server and "Maximum concurrency for 512 tokens per request: 1.50x" in server
    assert get_drill("max-num-seqs-override-log").expected() == 6 // 2
    assert calls.requests_that_fit(6, 128, 512) == int(1.50)


def test_moe_weights_hold_every_expert():
    # "A4B" = about 4B active; all 26B must be resident: weights far above active x 2 bytes.
    active = _arg("moe-active-params", model="gemma-4-26b-a4b")
    assert 3.5 < active < 4.5
    # one "active parameters" figure in the book: Qwen3-30B-A3B's model card says 3.3B (models/SOURCES.md)
    assert _arg("moe-active-params", model="qwen3-30b-a3b") == pytest.approx(3.3, abs=0.06)
    assert _arg("memory-moe-weights", model="gemma-4-26b-a4b") > 5 * active * 1e9 * 2 / GIB


# ------------------------------------------------------------------ grading

@pytest.mark.parametrize("text, value", [
    ("4.0 GiB", 4.0), ("1,568,032 tokens", 1568032), ("24%", 24), ("about 2.5k tokens", 2500),
    ("-3", -3), (".5", 0.5), ("1e3", 1000), ("12 ms", 12),
])
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_numeric_grading_accepts_within_tolerance_and_hints_at_the_k_and_v_slip():
    d = get_drill("memory-kv-per-token")
    exp = d.expected()
    assert check_answer(d, f"{exp * 1.005} KiB").correct
    low = check_answer(d, f"{exp / 2}")
    assert not low.correct and "K and V" in low.message and low.expected == exp
    high = check_answer(d, f"{exp * 2}")
    assert not high.correct and "factor of two" in high.message
    assert "Mechanism" in low.explanation
    with pytest.raises(DrillError, match="no number"):
        check_answer(d, "lots")


def test_keyword_grading_names_the_missing_ideas():
    good = check_answer("prefix-cache-timestamp", "The block hash chains each parent, so all later blocks miss.")
    assert good.correct and good.missing == ()
    bad = check_answer("prefix-cache-timestamp", "The cache is too small.")
    assert not bad.correct and bad.missing and "hash" in bad.message


def test_unknown_drill_lists_the_ids():
    with pytest.raises(DrillError, match="engine-idle-gpu"):
        get_drill("no-such-drill")


# ------------------------------------------------------------------ rendering

@pytest.mark.parametrize("drill", DRILLS, ids=[d.id for d in DRILLS])
def test_every_drill_renders(drill):
    for seed in (0, 1, 2):
        md = render_markdown(drill, seed)
        assert md.count(":::{dropdown} Answer") == 1 and md.rstrip().endswith(":::")
        assert drill.question_text(seed) in md
        assert "{" + "value" not in md and "{" + "unit" not in md
        html = render_html(drill, seed)
        assert "<details>" in html
        q = question_html(drill, seed)
        assert "Mechanism" not in q  # the self-check shows the question without the answer
        if drill.numeric:
            assert drill.call in md
        if drill.exhibit is not None:
            assert drill.exhibit.lines()[0] in md


def test_page_renders_every_section_once():
    page = (ROOT / "book" / "06-26-interview-drills.md").read_text()
    shown = re.findall(r'^show\("([0-9.]+)"\)$', page, re.M)
    assert shown == list(SECTIONS)
    for section in SECTIONS:
        assert render_section(section).count(":::{dropdown} Answer") == sum(d.section == section for d in DRILLS)
    assert "render_markdown_format: myst" in page  # dropdowns in cell output are parsed as MyST


# ------------------------------------------------------------------ loading errors

@pytest.mark.parametrize("body, message", [
    ("[[drill]]\nid = 'a'\n", "lacks 'section'"),
    ("[[drill]]\nid='a'\nsection='6.1'\nkind='trivia'\nquestion='q'\nanswer='a'\nkeywords=[['x']]\n", "kind"),
    ("[[drill]]\nid='a'\nsection='7.1'\nkind='concept'\nquestion='q'\nanswer='a'\nkeywords=[['x']]\n", "section"),
    ("[[drill]]\nid='a'\nsection='6.1'\nkind='numeric'\nquestion='q'\nanswer='a'\n", "needs a 'call'"),
    ("[[drill]]\nid='a'\nsection='6.1'\nkind='concept'\nquestion='q'\nanswer='a'\n", "keywords"),
    ("[[drill]]\nid='a'\nsection='6.1'\nkind='concept'\nquestion='q'\nanswer='a'\nkeywords=[['x']]\n" * 2, "twice"),
    ("[[drill]\n", "not valid TOML"),
])
def test_malformed_data_says_what_to_change(tmp_path, body, message):
    p = tmp_path / "drills.toml"
    p.write_text(body)
    with pytest.raises(DrillError, match=message):
        load_drills(p)


def test_calls_outside_the_calls_module_are_refused(tmp_path):
    p = tmp_path / "drills.toml"
    p.write_text("[[drill]]\nid='a'\nsection='6.1'\nkind='numeric'\nquestion='q'\nanswer='{value}'\n"
                 "call='os.system'\nargs={command='true'}\n")
    with pytest.raises(DrillError, match="servebook.drills.calls"):
        load_drills(p)[0].expected()


# ------------------------------------------------------------------ CLI

def test_cli_list_json_prints_every_drill(capsys):
    assert cli_main(["drills", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == [d.id for d in DRILLS]
    assert all(set(r) == {"id", "section", "kind", "question"} for r in rows)


def test_cli_show_and_check(capsys):
    assert cli_main(["drills", "show", "memory-kv-per-token", "--answer", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["expected"] == 128 and shown["unit"] == "KiB"
    assert cli_main(["drills", "check", "memory-kv-per-token", "128 KiB"]) == 0
    assert cli_main(["drills", "check", "memory-kv-per-token", "64 KiB"]) == 1
    assert "K and V" in capsys.readouterr().out
    assert cli_main(["drills", "show", "no-such-drill"]) == 2
    assert "use one of" in capsys.readouterr().err


def _lab3() -> dict:
    """Lab 3's recorded H200 sweep as the book renders it (two part files, merged)."""
    from servebook.lab.analyses.lab3_preemption import load_l3

    return load_l3()


#: How drill errors name Lab 3's recording: its part files, merged.
LAB3_NAME = "labs/results/labs/l3_preemption_{16_48,128_256}_gpu.json"


def test_lab_preemption_drill_shows_and_answers_from_the_recorded_h200_run():
    data = _lab3()
    assert data["vllm_version"] == "0.26.0" and data["gpu"]["name"] == "NVIDIA H200"
    points = {pt["max_num_seqs"]: pt for pt in data["measurements"]["points"]}
    d = get_drill("max-num-seqs-lab-preemption")
    assert d.section == "6.9" and d.kind == "debugging"
    # The answer is the counter the lab read from /metrics at max_num_seqs 128; none at 48.
    assert d.expected() == points[128]["preemptions"] > 0 == points[48]["preemptions"]
    # The KV ceiling, from the engine's own log line: 'GPU KV cache size: N tokens' over 512 + 128 tokens.
    log = points[128]["log"]
    kv_tokens = int(re.search(r"GPU KV cache size: ([0-9,]+) tokens", log).group(1).replace(",", ""))
    w = data["measurements"]["workload"]
    assert d.facts_for()["fit"] == kv_tokens // (w["input_len"] + w["output_len"])
    assert 48 < d.facts_for()["fit"] < 128   # one cap below the ceiling, one above
    # The exhibit shows exactly the two points, in order, each figure as the file holds it,
    # then only that engine's own log lines.
    lines = d.exhibit.lines()
    starts = [i for i, line in enumerate(lines) if line.startswith('"max_num_seqs": ')]
    assert [lines[i] for i in starts] == ['"max_num_seqs": 48', '"max_num_seqs": 128']
    for start, end, n in ((starts[0], starts[1], 48), (starts[1], len(lines), 128)):
        block = lines[start:end]
        summary = points[n]["bench"]["summary"]
        assert f'"output_throughput": {json.dumps(summary["output_throughput"])}' in block
        assert f'"p99_itl_ms": {json.dumps(summary["p99_itl_ms"])}' in block
        assert f'"preemptions": {json.dumps(points[n]["preemptions"])}' in block
        log_lines = [x for x in block if not x.startswith('"')]
        assert log_lines and all(x in points[n]["log"].splitlines() for x in log_lines)
    md = render_markdown(d)
    assert "vLLM 0.26.0" in md and lines[0] in md


def test_a_missing_lab_field_names_the_file_the_dotted_field_and_the_fields_there():
    from servebook.drills import Exhibit

    m = _lab3()["measurements"]
    name = LAB3_NAME
    with pytest.raises(ServebookError) as err:
        calls.lab_value("l3_preemption_gpu", "workload.input_tokens")
    msg = str(err.value)
    assert msg.startswith(f"{name} has no field measurements.workload.input_tokens:")
    assert "no 'input_tokens'" in msg and all(key in msg for key in m["workload"])
    # A point is named by its place in measurements.points; a number has no fields below it.
    index = [pt["max_num_seqs"] for pt in m["points"]].index(48)
    with pytest.raises(ServebookError, match=re.escape(
            f"{name} has no field measurements.points[{index}].bench.summary.p99_itl_s:")) as err:
        calls.lab_point_value("l3_preemption_gpu", "max_num_seqs", 48, "bench.summary.p99_itl_s")
    assert all(key in str(err.value) for key in m["points"][index]["bench"]["summary"])
    with pytest.raises(ServebookError, match=r"measurements\.block_size is \d+, not an object"):
        calls.lab_value("l3_preemption_gpu", "block_size.tokens")
    shown = Exhibit(source="lab", name="l3_preemption_gpu", points={"max_num_seqs": [48]}, fields=("bench.p99",))
    with pytest.raises(DrillError, match=re.escape(
            f"exhibit {name} has no field measurements.points[{index}].bench.p99: measurements.points[{index}].bench "
            "has no 'p99'; its fields are")):
        shown.lines()


SLO_DRILLS = ("slo-tp-or-replicas", "slo-moe-or-dense", "slo-gpu-choice")


@pytest.mark.parametrize("drill_id", SLO_DRILLS)
def test_design_drills_size_for_an_slo_and_a_budget(drill_id):
    from servebook.simulator.sizing import replica_latency

    d = get_drill(drill_id)
    a = d.args
    assert d.kind == "design" and d.numeric
    q = d.question_text()
    assert "p99 TTFT" in q and "p99 TPOT" in q and "USD" in q and "per hour" in q
    cost = d.expected()
    assert 0 < cost <= a["budget_per_hour"]

    def meets(gpu, tp, replicas):
        lat = replica_latency(a["model"], gpu, tp, a["rate"] / replicas, a["input_tokens"], a["output_tokens"])
        return lat.p99_ttft_s <= a["p99_ttft_s"] and lat.p99_tpot_s * 1e3 <= a["p99_tpot_ms"]

    # Some candidate at that cost meets the SLO, and no cheaper candidate does (the search is minimal).
    at_cost = [(g, tp, r) for g, price in zip(a["gpus"], a["prices"]) for tp in a["tps"] for r in range(1, 9)
               if math.isclose(r * tp * price, cost)]
    assert any(meets(*c) for c in at_cost)
    for gpu, price in zip(a["gpus"], a["prices"]):
        for tp in a["tps"]:
            for replicas in range(1, 9):
                if replicas * tp * price < cost - 1e-9:
                    assert not meets(gpu, tp, replicas), (gpu, tp, replicas)


def test_design_drill_prose_claims_hold():
    tp = get_drill("slo-tp-or-replicas")
    facts = tp.facts_for()
    assert facts["tp1_cost"] > tp.args["budget_per_hour"]          # "TP 1 ... over the budget"
    assert facts["tp2_cost"] >= tp.expected()
    moe = get_drill("slo-moe-or-dense")
    facts = moe.facts_for()
    assert facts["dense_cost"] > moe.args["budget_per_hour"]       # "the dense model ... over the budget"
    assert facts["moe_active"] < facts["dense_active"] / 5
    from servebook.hf_config import load_model_spec

    moe_spec, dense_spec = load_model_spec("qwen3-30b-a3b"), load_model_spec("qwen3-32b")
    assert moe_spec.num_layers < dense_spec.num_layers                         # "fewer layers
    assert moe_spec.layers[0].num_kv_heads < dense_spec.layers[0].num_kv_heads   # and KV heads"
    gpu = get_drill("slo-gpu-choice")
    facts = gpu.facts_for()
    assert facts["h200_tpot"] < facts["h100_tpot"]                 # faster HBM, shorter decode steps
    assert facts["h100_replicas"] == facts["h200_replicas"]        # "... so the price per GPU decides"
    from servebook.perf import gpu_numbers

    assert gpu_numbers("h100").bf16_dense_flops == gpu_numbers("h200").bf16_dense_flops  # "same bf16 peak"
    assert gpu_numbers("h100").hbm_bandwidth_bytes_per_s < gpu_numbers("h200").hbm_bandwidth_bytes_per_s
    assert gpu.expected() == min(facts["h100_cost"], facts["h200_cost"])


def test_graph_and_padding_drills_agree_with_the_recorded_logs():
    from servebook.hf_config import load_model_spec
    from servebook.memory import uses_v2_model_runner

    log = (LOGS / "h200-0.26.0-qwen3-30b-a3b--timing" / "startup.log").read_text()
    pool = re.search(r"CUDA graph pool memory: ([0-9.]+) GiB \(actual\), ([0-9.]+) GiB \(estimated\)", log)
    assert get_drill("cuda-graph-moe-estimate").expected() == pytest.approx(float(pool.group(1)) - float(pool.group(2)))
    # The drill says this MoE runs the V1 runner; the log agrees (no V2 line) and so does the library.
    assert "Using V2 Model Runner" not in log and not uses_v2_model_runner(load_model_spec("qwen3-30b-a3b"))
    gemma = (LOGS / "h200-0.26.0-gemma-3-27b--eager" / "startup.log").read_text()
    padding = re.search(r"Add (\d+) padding layers, may waste at most ([0-9.]+)%", gemma)
    assert get_drill("memory-padding-warning").expected() == int(padding.group(1))
    # Hand arithmetic: 62 layers at 5 sliding : 1 global -> 52 sliding + 10 global; groups of 10
    # -> the 52 sliding layers fill 6 groups (60 slots): 8 padding, 8 / 52 = 15.38%.
    assert 6 * 10 - 52 == int(padding.group(1)) and round(8 / 52 * 100, 2) == float(padding.group(2))


@pytest.mark.parametrize("text, unit, value", [
    ("131072 B", "KiB", 128.0),             # 131,072 / 1,024 (bytes, not billions)
    ("131,072 bytes", "KiB", 128.0),
    ("0.125 MiB", "KiB", 128.0),            # 0.125 x 1,024
    ("128 GiB", "KiB", 128 * 1024 * 1024),  # a GiB answer to a KiB question is 2**20 times too big
    ("128 kib", "KiB", 128.0),
    ("131.072 kB", "KiB", 128.0),           # 131,072 bytes written in decimal kilobytes
    ("16 GB", "GiB", 16e9 / 2**30),         # 14.90 GiB: GB is decimal
    ("3600 s", "h", 1.0),
    ("90 min", "h", 1.5),
    ("0.0087 s", "ms", 8.7),
    ("24%", "%", 24.0),
    ("2.5k tokens", "tokens", 2500.0),
    ("7b", "x", 7e9),
    ("42", "KiB", 42.0),                    # no unit: the drill's
])
def test_parse_quantity_converts_to_the_drills_unit(text, unit, value):
    from servebook.drills.grading import parse_quantity

    assert parse_quantity(text, unit) == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("text, unit, words", [
    ("128 ms", "KiB", "give it in KiB"),
    ("24%", "GiB", "give it in GiB"),
    ("16G", "GiB", "write the unit out"),
])
def test_parse_quantity_refuses_a_unit_of_another_kind(text, unit, words):
    from servebook.drills.grading import parse_quantity

    with pytest.raises(DrillError, match=words):
        parse_quantity(text, unit)


def test_kv_per_token_drill_grades_by_magnitude(capsys):
    # memory-kv-per-token's answer is 128 KiB (Llama-3.1-8B: 2 x 8 KV heads x 128 x 2 bytes x 32 layers
    # = 131,072 bytes); the same number in another unit is right only when it is the same amount.
    assert 2 * 8 * 128 * 2 * 32 == 131072
    for answer, status in (("128 GiB", 1), ("131072 B", 0), ("0.125 MiB", 0), ("128 KB", 1), ("128 ms", 2)):
        assert cli_main(["drills", "check", "memory-kv-per-token", answer]) == status, answer
    assert "did you mean KiB" in capsys.readouterr().out


def test_a_fraction_for_a_percentage_is_told_so():
    d = get_drill("paged-contiguous-waste")
    assert d.unit == "%"
    exp = d.expected(0)
    graded = check_answer(d, f"{exp / 100!r}")
    assert not graded.correct and "The answer is a percentage" in graded.message
    assert check_answer(d, f"{exp!r}%").correct
