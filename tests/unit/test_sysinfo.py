"""`specserve env` / specserve.system_info(): what it reports is what the kernels really run and what the
machine really has, so a bug report or a benchmark record can be trusted."""
import json

import pytest

import specserve
from specserve import kernels
from specserve.cli.main import main


def cpuinfo_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())


def test_the_cpu_flags_are_the_machines():
    info = specserve.system_info()
    have = cpuinfo_flags()
    from specserve.sysinfo import FLAGS
    assert set(info["cpu"]["flags"]) == {f for f in FLAGS if f in have}
    assert info["cpu"]["cores"] >= 1


@pytest.mark.skipif(not kernels.available(), reason="no compiler / AVX2 for the block kernels")
def test_the_kernel_builds_are_the_ones_that_run():
    ext = kernels.ext()
    before = ext.q8_kernel_build()
    try:
        for build in ("avx2", "reference"):  # every CPU with the kernels can run these two
            ext.q8_kernel_build(build)
            assert specserve.system_info()["kernels"]["int8 activations (--activations int8)"] == build
    finally:
        ext.q8_kernel_build(before)
    k = specserve.system_info()["kernels"]
    assert k["available"] and k["directory"] == kernels.build_directory()
    assert k["fp32 activations"] == ("avx512" if ext.block_kernel_avx512() else "avx2")


def test_switches_that_are_set_are_named(monkeypatch):
    monkeypatch.setenv("SPECSERVE_NO_AMX", "1")
    monkeypatch.delenv("SPECSERVE_KERNEL_CACHE", raising=False)
    info = specserve.system_info()
    assert info["switches"]["SPECSERVE_NO_AMX"] == "1" and "SPECSERVE_KERNEL_CACHE" not in info["switches"]
    assert "SPECSERVE_NO_AMX=1" in specserve.format_system_info(info)


def test_the_env_command_prints_it(capsys):
    assert main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["specserve"] == specserve.__version__ and "qwen2.5-coder-1.5b" in info["models"]
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"specserve {specserve.__version__}") and "\nCPU: " in text and "\nkernels:" in text


def test_the_summary_line_names_the_cpu_and_the_builds():
    info = specserve.system_info()
    line = specserve.summary_line(info)
    assert line.startswith(info["cpu"]["model"]) and f"{info['torch']['threads']} threads" in line
    k = info["kernels"]
    if k["available"]:
        assert f"int8 {k['int8 activations (--activations int8)']}" in line


def test_the_speed_hint_names_int8_only_where_fp32_decodes_gguf_blocks_without_avx512():
    """On CPUs without AVX-512 the fp32 mode decodes GGUF blocks at half llama.cpp's speed
    (docs/decisions.md#fp32-avx2-q4k): serve and generate say --activations int8 there, and nowhere else."""
    def info(available=True, fp32="avx2", switches=None):
        return {"switches": switches or {},
                "kernels": {"available": available, "fp32 activations": fp32} if available else {"available": False}}
    for device in ("cpu", "cpu:0"):
        hint = specserve.speed_hint(info(), device, "gguf")
        assert hint and "--activations int8" in hint and hint.startswith("this CPU lacks AVX-512")
    # the AVX-512 build switched off: the line names the switch, not the CPU
    assert specserve.speed_hint(info(switches={"SPECSERVE_NO_AVX512": "1"}), "cpu", "gguf").startswith("SPECSERVE_NO_AVX512")
    assert specserve.speed_hint(info(fp32="avx512"), "cpu", "gguf") is None
    assert specserve.speed_hint(info(available=False), "cpu", "gguf") is None
    assert specserve.speed_hint(info(), "cuda", "gguf") is None
    assert specserve.speed_hint(info(), "cuda:0", "gguf") is None
    for kernel in ("int8", "blocks", "dense"):
        assert specserve.speed_hint(info(), "cpu", kernel) is None
