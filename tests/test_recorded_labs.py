"""The recorded GPU labs (labs/results/labs/*_gpu.json) load with their provenance, and the tables
and plots the book renders from them (servebook.lab.analyses.lab1_memory ... lab6_prefix_caching) agree with
numbers recomputed here, by hand, from the raw measurements in the files.
"""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from servebook.lab.harness import LabError  # noqa: E402
from lab_pages import lab_note  # noqa: E402
from servebook.lab.recordings.engine_stats import bench_prefix_caches, load_hit_pct, logged_max_running  # noqa: E402
from servebook.lab.analyses.lab1_memory import l1_table, plot_l1  # noqa: E402
from servebook.lab.analyses.lab2_batching import change_quantities as l2_changes  # noqa: E402
from servebook.lab.analyses.lab2_batching import l2_summary, plot_l2, static_useful_fraction  # noqa: E402
from servebook.lab.analyses.lab3_preemption import (  # noqa: E402
    first_preempting, l3_table, load_l3, plot_l3, preemption_knee)
from servebook.lab.analyses.lab4_fp8_kv import change_quantities as l4_changes  # noqa: E402
from servebook.lab.analyses.lab4_fp8_kv import l4_ratios, l4_table, plot_l4  # noqa: E402
from servebook.lab.analyses.lab5_chunked_prefill import l5_table, plot_l5  # noqa: E402
from servebook.lab.analyses.lab6_prefix_caching import l6_offline_table, l6_serving_table, plot_l6  # noqa: E402
from servebook.lab.recordings.recorded import load_recorded, provenance, what_ran  # noqa: E402
from servebook.lab.recordings.rerecordings import PREVIOUS_RECORDINGS, previous_path, recording_changes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "labs" / "results" / "labs"
LABS = ["l1_memory_budget", "l2_paged_continuous", "l3_preemption", "l4_fp8_kv", "l5_chunked_prefill",
        "l6_prefix_caching"]
RAW = ROOT / "labs" / "results" / "raw"
#: Labs 2-4 were re-recorded with distinct prompts on 2026-12-01; the others are the first run.
RERECORDED = ("l2_paged_continuous", "l3_preemption", "l4_fp8_kv")
DATES = {lab: "2026-12-01" if lab in RERECORDED else "2026-11-30" for lab in LABS}
#: Lab 3's sweep is recorded in two part files (two device calls), in --max-num-seqs order.
L3_PARTS = ("l3_preemption_16_48_gpu.json", "l3_preemption_128_256_gpu.json")


def raw(lab: str) -> dict:
    """The recorded file as JSON; Lab 3's two part files joined by hand (first file's header, all points)."""
    if lab != "l3_preemption":
        return json.loads((RESULTS / f"{lab}_gpu.json").read_text())
    first, second = (json.loads((RESULTS / name).read_text()) for name in L3_PARTS)
    first["lab"] = "l3_preemption"
    first["measurements"]["points"] += second["measurements"]["points"]
    return first


def rendered(lab: str) -> dict:
    """What the book renders for ``lab`` (Lab 3: its parts merged by ``load_l3``)."""
    return load_l3() if lab == "l3_preemption" else load_recorded(RESULTS / f"{lab}_gpu.json", lab=lab)


@pytest.fixture(scope="module")
def docs() -> dict:
    return {lab: rendered(lab) for lab in LABS}


# ---- provenance -----------------------------------------------------------------------------

@pytest.mark.parametrize("lab", LABS)
def test_recorded_file_has_provenance_of_the_h200_run(lab):
    doc = rendered(lab)
    assert doc["schema"] == "servebook.lab/1" and doc["profile"] == "gpu"
    assert doc["gpu"]["name"] == "NVIDIA H200" and doc["gpu"]["count"] == 1 and doc["gpu"]["driver"]
    assert doc["vllm_version"] == "0.26.0"          # the lent GPU runs 0.26.0, not the book's 0.27.1
    assert doc["date"].startswith(DATES[lab])
    # The config the engine loaded is the one whose hash the file carries (canonical JSON, by hand).
    blob = json.dumps(doc["config"], sort_keys=True, separators=(",", ":")).encode()
    assert doc["config_sha256"] == hashlib.sha256(blob).hexdigest()
    head = provenance(doc)
    assert (head["layers"], head["hidden_size"], head["kv_heads"]) == (32, 4096, 8)   # Llama 3.1 8B shape
    assert head["vllm_version"] == "0.26.0" and head["date"] == DATES[lab]


# ---- L1 -------------------------------------------------------------------------------------

def test_l1_table_ratios_recomputed_from_raw_points(docs):
    points = raw("l1_memory_budget")["measurements"]["points"]
    rows = l1_table(docs["l1_memory_budget"]["measurements"]["points"])
    assert len(rows) == len(points) == 4
    for row, p in zip(rows, points):
        assert row["tokens engine"] == p["engine"]["kv_cache_tokens"]
        assert row["engine/predicted"] == pytest.approx(p["engine"]["kv_cache_tokens"] / p["prediction"]["kv_cache_tokens"])
        # At utilisation 0.9 and 0.5 the calculator is within 1% of the engine.
        assert 0.99 < row["engine/predicted"] < 1.01, row


def test_l1_engine_tokens_follow_from_its_logged_gib():
    # Llama 3.1 8B: 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes (bf16) = 131,072 B/token.
    bytes_per_token = {"auto": 2 * 32 * 8 * 128 * 2, "fp8": 2 * 32 * 8 * 128 * 1}
    for p in raw("l1_memory_budget")["measurements"]["points"]:
        gib, tokens = p["engine"]["available_kv_cache_gib"], p["engine"]["kv_cache_tokens"]
        # The log rounds GiB to 0.01: the token count agrees to that rounding.
        assert tokens == pytest.approx(gib * 2**30 / bytes_per_token[p["point"]["kv_cache_dtype"]], rel=1e-4)


def test_l1_table_keeps_a_start_that_failed():
    point = {"point": {"max_model_len": 8, "gpu_memory_utilization": 0.9, "kv_cache_dtype": "auto"},
             "prediction": {"available_kv_gib": 1.0, "kv_cache_tokens": 100}, "engine": None}
    [row] = l1_table([point])
    assert row["tokens engine"] is None and row["engine/predicted"] is None


# ---- L2 -------------------------------------------------------------------------------------

def test_l2_speedup_recomputed_from_requests(docs):
    m = raw("l2_paged_continuous")["measurements"]
    reqs = m["vllm"]["requests"]
    v_tput = sum(q["output_len"] for q in reqs) / max(q["start_s"] + q["latency_s"] for q in reqs)
    static = m["static_baseline"]
    h_tput = static["output_tokens"] / static["wall_s"]
    s = l2_summary(docs["l2_paged_continuous"]["measurements"])
    assert s["vllm_output_throughput"] == pytest.approx(v_tput)
    assert s["static_output_throughput"] == pytest.approx(h_tput)
    assert s["speedup"] == pytest.approx(v_tput / h_tput)
    assert 23 < s["speedup"] < 23.3                                 # the lab's note says "23.1x"
    # Both systems produced the same output tokens; static batching computed more (padding).
    assert static["output_tokens"] == sum(q["output_len"] for q in reqs)
    assert s["useful_fraction"] == pytest.approx(static["output_tokens"] / static["computed_tokens"])
    p50 = sorted(q["latency_s"] for q in reqs)[len(reqs) // 2]
    assert s["rows"][0]["p50 s"] == p50


def test_static_useful_fraction_by_hand():
    # L = 256, r = 0.9: lengths on [25, 486]; the max of 32 draws is expected at 25 + 461 * 32 / 33.
    assert static_useful_fraction(256, 0.9, 32) == pytest.approx(256 / (25 + 461 * 32 / 33))
    # No spread: every slot is useful.
    assert static_useful_fraction(100, 0.0, 8) == pytest.approx(1.0)


# ---- L3 -------------------------------------------------------------------------------------

def test_l3_knee_and_first_preempting_point(docs):
    m = raw("l3_preemption")["measurements"]
    # 512 + 128 tokens in 16-token blocks = 40 blocks; 2,048 // 40 = 51 requests fit.
    assert preemption_knee(2048, 512, 128, 16) == (40, 51) == (m["blocks_per_request"], m["predicted_knee"])
    assert preemption_knee(2048, 513, 128, 16) == (41, 49)   # one token more: a 41st block
    by_seqs = {p["max_num_seqs"]: p["preemptions"] for p in m["points"]}
    assert by_seqs[48] == 0 and by_seqs[128] > 0
    assert first_preempting(docs["l3_preemption"]["measurements"]["points"]) == 128
    assert first_preempting([{"max_num_seqs": 8, "preemptions": 0}]) is None
    rows = l3_table(docs["l3_preemption"]["measurements"]["points"])
    assert [r["max_num_seqs"] for r in rows] == [16, 48, 128, 256]
    for r, p in zip(rows, m["points"]):
        s = p["bench"]["summary"]
        assert r["output_throughput"] == pytest.approx(s["total_output_tokens"] / s["duration"])


# ---- L4 -------------------------------------------------------------------------------------

def test_l4_ratios_recomputed(docs):
    e = raw("l4_fp8_kv")["measurements"]["engines"]
    tput = {d: e[d]["bench"]["summary"]["total_output_tokens"] / e[d]["bench"]["summary"]["duration"] for d in e}
    m = docs["l4_fp8_kv"]["measurements"]
    tokens, throughput = l4_ratios(["auto", "fp8"], m["engines"])
    assert tokens == pytest.approx(e["fp8"]["kv_cache_tokens"] / e["auto"]["kv_cache_tokens"])
    assert 1.99 < tokens < 2.01
    assert throughput == pytest.approx(tput["fp8"] / tput["auto"], rel=1e-6)
    rows = l4_table(["auto", "fp8"], m["predictions"], m["engines"])
    assert [r["preemptions"] for r in rows] == [e["auto"]["preemptions"], e["fp8"]["preemptions"]]
    assert rows[0]["preemptions"] > rows[1]["preemptions"] > 0      # both preempted, fp8 fewer times



# ---- L5 -------------------------------------------------------------------------------------

def test_l5_table_recomputed_from_the_step_log_and_the_runs(docs):
    m = docs["l5_chunked_prefill"]["measurements"]
    w = m["workload"]
    rows = {(r["chunking"], r["budget"]): r for r in l5_table(m)}
    assert len(rows) == len(m["configs"]) == len(w["max_num_batched_tokens"]) + 1
    for c in m["configs"]:
        budget = c["max_num_batched_tokens"]
        row = rows[("on" if c["chunked"] else "off", budget)]
        # Steps: each chunked step gives the prompt what the decodes leave of the budget.
        room = budget - w["decode_requests"] if c["chunked"] else w["long_prompt_tokens"]
        assert row["steps engine"] == -(-w["long_prompt_tokens"] // room) == len(c["first_run"]["long_prompt_chunks"])
        # Client times are the medians of the repeats (3 runs: the middle one).
        ttfts = sorted(x["ttft_s"] for x in c["summaries"])
        assert len(ttfts) == w["repeats"] == 3 and row["TTFT ms measured"] == pytest.approx(ttfts[1] * 1e3)
        # Engine step while prefilling: the span of the chunk steps in the engine's own log.
        times = [step["t"] for step in c["first_run"]["long_prompt_chunks"]]
        if len(times) > 1:
            assert row["step ms engine"] == pytest.approx((times[-1] - times[0]) / (len(times) - 1) * 1e3)
            assert all(b > a for a, b in zip(times, times[1:]))
        else:
            assert row["step ms engine"] is None and not c["chunked"]


def test_l5_chunking_cut_the_gap_and_the_knee_is_the_recorded_one(docs):
    m = docs["l5_chunked_prefill"]["measurements"]
    rows = l5_table(m)
    off = next(r for r in rows if r["chunking"] == "off")
    assert all(r["worst ITL ms measured"] < off["worst ITL ms measured"] / 4 for r in rows if r["chunking"] == "on")
    assert m["measured_knee"] == 1024 and m["prediction"]["knee"] == 256 and m["complete"] and not m["skipped"]


# ---- L6 -------------------------------------------------------------------------------------

def test_l6_tables_recomputed_from_the_counters(docs):
    m = docs["l6_prefix_caching"]["measurements"]
    serving = l6_serving_table(m)
    assert len(serving) == 2 * len(m["predicted"])
    for r in serving:
        counters = m["engines"][r["caching"]]["workloads"][r["workload"]]
        if r["caching"] == "off":
            assert counters["queries"] == counters["hits"] == 0 and r["hit rate"] is None
        else:
            assert r["hit rate"] == counters["hits"] / counters["queries"]
            assert r["predicted hit rate"] == m["predicted"][r["workload"]]["hit_rate"]
    offline = {r["order"]: r for r in l6_offline_table(m)}
    for order, r in offline.items():
        o = m["engines"]["on"]["offline"][order]
        assert r["hit rate"] == o["hits"] / o["queries"] and r["wall s"] == o["wall_s"]
    assert offline["grouped"]["hit rate"] > offline["shuffled"]["hit rate"]


def test_l6_system_workload_hits_by_hand(docs):
    m = docs["l6_prefix_caching"]["measurements"]
    w, bs = m["workloads"]["system"], m["block_size"]
    on = m["engines"]["on"]["workloads"]["system"]
    prompt = w["system_prompt_tokens"] + w["suffix_tokens"]
    # Queried: every prompt whole. Hit: all requests but those admitted before the prefix was cached
    # reuse the system prompt's full blocks; here 2048 = 128 blocks of 16, and all but the first hit.
    assert on["queries"] == w["num_requests"] * prompt
    assert on["hits"] == (w["num_requests"] - 1) * (w["system_prompt_tokens"] // bs * bs)

# ---- plots ----------------------------------------------------------------------------------

PLOTS = {"l1": plot_l1, "l2": plot_l2, "l3": plot_l3, "l4": plot_l4, "l5": plot_l5, "l6": plot_l6}


@pytest.mark.parametrize("lab,plot", [("l1_memory_budget", "l1"), ("l2_paged_continuous", "l2"),
                                      ("l3_preemption", "l3"), ("l4_fp8_kv", "l4"),
                                      ("l5_chunked_prefill", "l5"), ("l6_prefix_caching", "l6")])
def test_plots_label_every_axis_with_units(docs, lab, plot):
    import matplotlib.pyplot as plt

    doc = docs[lab]
    m = doc["measurements"]
    fig = PLOTS[plot](m["points"] if plot == "l1" else m, doc)
    try:
        for ax in fig.axes:
            assert ax.get_ylabel(), (plot, ax)
            assert any(u in ax.get_ylabel() for u in ("tokens", "count", "share", "/s", ", ms", ", s")), \
                ax.get_ylabel()
        # Every panel (a twin y axis shares its panel's position) has a labelled x axis.
        panels: dict = {}
        for ax in fig.axes:
            panels.setdefault(tuple(round(v, 3) for v in ax.get_position().bounds), []).append(ax.get_xlabel())
        assert all(any(labels) for labels in panels.values()), (plot, panels)
        assert "0.26.0" in (fig.axes[0].get_title() + (fig._suptitle.get_text() if fig._suptitle else ""))
    finally:
        plt.close(fig)


def test_markdown_table_formats_like_the_lab_tables():
    from servebook.lab.harness.table import markdown_table

    text = markdown_table([{"a": 1234, "b": 0.96875, "c": None}, {"a": 5, "b": 2500.4, "c": "x"}])
    assert text.splitlines() == ["| a | b | c |", "|---:|---:|---:|", "| 1,234 | 0.969 | — |", "| 5 | 2,500 | x |"]


# ---- bad input ------------------------------------------------------------------------------

def _write(tmp_path, doc) -> Path:
    path = tmp_path / "x_gpu.json"
    path.write_text(json.dumps(doc))
    return path


def test_wrong_schema_is_refused_naming_it(tmp_path):
    doc = raw("l3_preemption")
    doc["schema"] = "servebook.startup-logs/1"
    with pytest.raises(LabError, match="servebook.startup-logs/1.*expected 'servebook.lab/1'"):
        load_recorded(_write(tmp_path, doc))


@pytest.mark.parametrize("drop", ["vllm_version", "date", "config", "gpu.driver", "gpu.name"])
def test_missing_provenance_field_is_named(tmp_path, drop):
    doc = copy.deepcopy(raw("l4_fp8_kv"))
    if drop.startswith("gpu."):
        del doc["gpu"][drop[4:]]
    else:
        del doc[drop]
    with pytest.raises(LabError, match=f"lacks provenance field.*{drop.replace('.', '[.]')}"):
        load_recorded(_write(tmp_path, doc))


def test_other_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(LabError, match="no such lab result"):
        load_recorded(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(LabError, match="is not JSON"):
        load_recorded(tmp_path / "bad.json")
    doc = raw("l4_fp8_kv")
    with pytest.raises(LabError, match="holds lab 'l4_fp8_kv', not 'l3_preemption'"):
        load_recorded(_write(tmp_path, doc), lab="l3_preemption")
    doc["date"] = "yesterday"
    with pytest.raises(LabError, match="not an ISO 8601"):
        load_recorded(_write(tmp_path, doc))


# ---- the lab pages link their results page (the labs are not executed: they quote no recorded number) ----

@pytest.mark.parametrize("lab", LABS)
def test_lab_note_links_its_results_page_and_names_the_recorded_files(lab):
    n = lab[1]
    note = lab_note(lab)
    assert f"<results_l{n}>" in note
    files = L3_PARTS if lab == "l3_preemption" else (f"{lab}_gpu.json",)
    assert all(f in note and (RESULTS / f).is_file() for f in files)
    page = (ROOT / "labs" / f"results_l{n}.md").read_text()
    assert f"{{doc}}`Lab {n} <{lab}>`" in page                    # and the page links back to its lab


@pytest.mark.parametrize("n", range(1, 7))
def test_results_page_runs_and_its_claims_hold(n, monkeypatch, capsys):
    """Each lab's results page (labs/results_l<N>.md, executed when the book is built) asserts the
    claims its prose makes in hidden cells: run them here too, so a claim that stops holding fails
    pytest, not only the book build."""
    import matplotlib.pyplot as plt
    from servebook.lab.harness.run_notebook import main

    monkeypatch.chdir(ROOT / "labs")
    try:
        rc = main(str(ROOT / "labs" / f"results_l{n}.md"))
    finally:
        plt.close("all")
    assert rc == 0, capsys.readouterr().err


def test_labs_1_to_6_ran_on_one_gpu_driver_release_and_model_config(docs):
    # (the claim the shared header of the old results page asserted; each lab's page now prints its own)
    first = docs[LABS[0]]
    for lab, doc in docs.items():
        assert (doc["gpu"]["name"], doc["gpu"]["driver"], doc["gpu"]["cuda"], doc["gpu"]["torch_version"],
                doc["vllm_version"]) == (first["gpu"]["name"], first["gpu"]["driver"], first["gpu"]["cuda"],
                                         first["gpu"]["torch_version"], first["vllm_version"]), lab
        assert doc["config_sha256"] == first["config_sha256"], lab
    assert first["vllm_version"] == "0.26.0"


def test_what_ran_prints_the_files_provenance(docs):
    doc = docs["l4_fp8_kv"]
    table = what_ran(doc)
    rows = dict(line.strip("|").split(" | ", 1) for line in table.splitlines()[2:])
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert rows["GPU"] == f"1 x NVIDIA H200, {doc['gpu']['total_memory_bytes'] / 2**30:.1f} GiB as torch reports it"
    assert rows["vLLM"] == "**0.26.0**" and rows["date (UTC)"] == doc["date"][:10]
    assert rows["driver, CUDA, torch"] == f"{doc['gpu']['driver']}, CUDA {doc['gpu']['cuda']}, torch {doc['gpu']['torch_version']}"
    assert f"{doc['config']['vocab_size']:,}" in rows["model"] and "32 layers" in rows["model"]
    assert rows["flags shared by its engines"] == ", ".join(f"`{k}={v}`" for k, v in doc["engine_args"].items())


def test_logged_prefix_hit_rate_reads_only_lines_with_a_load_running():
    from servebook.lab.recordings.engine_stats import engine_logs, logged_prefix_hit_pct

    line = "INFO [loggers.py:310] Engine 000: Avg prompt throughput: 1.0 tokens/s, Running: {} reqs, Waiting: 0 reqs, " \
           "GPU KV cache usage: 1.0%, Prefix cache hit rate: {}%"
    measurements = {"engines": {"a": {"log": "\n".join([line.format(0, "90.0"), line.format(1, "80.0"),
                                                         line.format(12, "33.3")])},
                                "b": {"log": line.format(200, "41.5") + "\nother text"}},
                    "points": [{"log": "no stats here"}], "n": 3}
    logs = engine_logs(measurements)
    assert len(logs) == 2                                   # only strings that carry the stats line
    assert logged_prefix_hit_pct(logs) == 41.5              # idle (0) and single-stream (1) lines left out
    assert logged_prefix_hit_pct(logs, min_running=100) == 41.5
    assert logged_prefix_hit_pct(logs, min_running=201) is None
    assert logged_prefix_hit_pct([]) is None


def _logged_rates(measurements) -> list[float]:
    from servebook.lab.recordings.engine_stats import engine_logs

    rates = []
    for log in engine_logs(measurements):
        for l in log.splitlines():
            if "Prefix cache hit rate:" in l and int(l.split("Running: ")[1].split()[0]) > 1:
                rates.append(float(l.rsplit("Prefix cache hit rate: ", 1)[1].rstrip("%").split("%")[0]))
    return rates


def test_first_runs_of_labs_2_to_4_hit_the_prefix_cache_with_their_random_prompts():
    # the caveat the results page prints: read here straight from the raw logs with a plain split.
    # The first runs of Labs 2-4 are kept in raw/.
    from servebook.lab.recordings.engine_stats import engine_logs, logged_prefix_hit_pct

    firsts = {lab: json.loads((RAW / f"{lab}_gpu-2026-11-30.json").read_text()) for lab in RERECORDED}
    for lab, doc in firsts.items():
        assert doc["date"].startswith("2026-11-30"), lab
        m = doc["measurements"]
        assert logged_prefix_hit_pct(engine_logs(m)) == max(_logged_rates(m)) > 30


def test_rerecorded_labs_2_to_4_had_distinct_prompts():
    # every vllm bench serve load of the new files: hits / queries from the counters, by hand
    for lab, n_loads in (("l2_paged_continuous", 1), ("l3_preemption", 4), ("l4_fp8_kv", 2)):
        m = raw(lab)["measurements"]
        benches = ([m["vllm"]] if lab.startswith("l2") else [p["bench"] for p in m["points"]] if lab.startswith("l3")
                   else [e["bench"] for e in m["engines"].values()])
        loads = [b["prefix_cache"] for b in benches]
        assert len(loads) == n_loads and bench_prefix_caches(m) == loads
        for b, pc in zip(benches, loads):
            assert pc["query_tokens"] >= b["summary"]["total_input_tokens"]   # every prompt token was looked up
            assert pc["hit_tokens"] / pc["query_tokens"] == pytest.approx(pc["hit_rate"]) and pc["hit_rate"] < 0.01
        assert load_hit_pct(raw(lab)) == (pytest.approx(100 * max(p["hit_rate"] for p in loads)), "counters")
        # The engines' own stats lines agree: no line with a load running logged 1% or more.
        assert max(_logged_rates(m), default=0.0) < 1


def test_previous_recordings_are_named_explicitly_and_dated():
    assert PREVIOUS_RECORDINGS == {"l2_paged_continuous": "l2_paged_continuous_gpu-2026-11-30.json",
                                     "l3_preemption": "l3_preemption_gpu-2026-11-30.json",
                                     "l4_fp8_kv": "l4_fp8_kv_gpu-2026-11-30.json"}
    for lab in PREVIOUS_RECORDINGS:
        path = previous_path(lab)
        assert path == RAW / f"{lab}_gpu-2026-11-30.json"
        doc = load_recorded(path, lab=lab)
        assert doc["date"][:10] == "2026-11-30" < raw(lab)["date"][:10]    # the rendered one is newer
    with pytest.raises(LabError, match="'l1_memory_budget' has not been re-recorded"):
        previous_path("l1_memory_budget")


def test_recording_changes_recomputed_by_hand():
    before = json.loads((RAW / "l4_fp8_kv_gpu-2026-11-30.json").read_text())
    after = raw("l4_fp8_kv")
    rows = {r["quantity"]: r for r in recording_changes(before, after, l4_changes)}
    tput = lambda doc, d: (doc["measurements"]["engines"][d]["bench"]["summary"]["total_output_tokens"]  # noqa: E731
                           / doc["measurements"]["engines"][d]["bench"]["summary"]["duration"])
    r = rows["auto: output tok/s"]
    assert (r["before"], r["after"]) == (pytest.approx(tput(before, "auto")), pytest.approx(tput(after, "auto")))
    assert r["after/before"] == pytest.approx(tput(after, "auto") / tput(before, "auto"))
    g = rows["fp8 / auto output throughput"]
    assert g["after"] == pytest.approx(tput(after, "fp8") / tput(after, "auto"))
    assert (rows["fp8: preemptions"]["before"], rows["fp8: preemptions"]["after"]) == (0, 8)
    assert rows["fp8: preemptions"]["after/before"] is None                    # no ratio over 0
    hit = rows["highest prefix-cache hit rate of a load, %"]
    assert hit["before"] > 30 > 1 > hit["after"] and hit["how"] == "engine log / counters"
    b2 = json.loads((RAW / "l2_paged_continuous_gpu-2026-11-30.json").read_text())
    rows2 = {r["quantity"]: r for r in recording_changes(b2, raw("l2_paged_continuous"), l2_changes)}
    assert rows2["vLLM / static output throughput"]["before"] == pytest.approx(
        l2_summary(b2["measurements"])["speedup"])


def test_recording_changes_refuses_what_is_not_a_rerecording():
    before = json.loads((RAW / "l4_fp8_kv_gpu-2026-11-30.json").read_text())
    other = copy.deepcopy(raw("l4_fp8_kv"))
    other["measurements"]["workload"]["num_prompts"] = 7
    with pytest.raises(LabError, match="differ in workload"):
        recording_changes(before, other, l4_changes)
    with pytest.raises(LabError, match="cannot compare a recording of 'l4_fp8_kv' with one of 'l2_paged_continuous'"):
        recording_changes(before, raw("l2_paged_continuous"), l4_changes)


def test_logged_max_running_reads_the_stats_lines():
    line = "Engine 000: Avg prompt throughput: 1.0 tokens/s, Running: {} reqs, Waiting: 0 reqs"
    assert logged_max_running("\n".join(line.format(n) for n in (3, 140, 12))) == 140
    assert logged_max_running("no stats") is None
