"""The engine's calibration in place: taken at start-up with speculation's cost-model fallback, and
taken again while serving when it was disturbed (issue 40: a busy start-up kept drafting off)."""
import pytest

from specserve import LLM, SamplingParams

from .tiny import make_tiny

pytest.importorskip("transformers")


def test_a_disturbed_startup_calibration_is_retaken_while_serving(tmp_path):
    path = str(tmp_path / "tiny")
    make_tiny("llama", path)
    llm = LLM(path, kv_cache_gib=0.01, block_size=4, speculative={"method": "suffix"})
    spec = llm.engine.speculator
    assert spec.calibrator is not None and spec.costs.calibrated  # taken at start-up
    assert max(spec.costs.calibrated) == 32  # the short curve: 1 .. 32 rows
    measured = dict(spec.costs.calibrated)
    # as if the machine had been 10x busier at start-up
    spec.costs.calibrated = {rows: 10 * s for rows, s in measured.items()}
    ref = LLM(path, kv_cache_gib=0.01, block_size=4).generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=24))
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=24))
    assert out[0].outputs[0].token_ids == ref[0].outputs[0].token_ids
    assert spec.calibrator.retakes == 1
    assert spec.costs.calibrated[1] < 5 * measured[1]  # the retaken curve, not the disturbed one
