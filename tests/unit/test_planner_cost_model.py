"""The measured cost model: stage splits by hand, profile files, and what it refuses."""
import pytest

from specserve.planner.cost_model import AnalyticCostModel, LayerProfile, MeasuredCostModel
from specserve.planner.model_table import MODEL_TABLE, parse_models

PROFILE = LayerProfile(model="toy", layer_s=[0.001, 0.010, 0.010, 0.010, 0.030, 0.002],
                       layer_bytes=[100, 10, 10, 10, 10, 100], boundary_s=0.0005, tokens=16)


def test_pipeline_split_minimises_the_slowest_stage():
    assert PROFILE.split(1) == [(0, 6)]
    # 0.021 | 0.010 + 0.032 would be 0.042; the best cut puts the 0.030 layer with just the head
    assert PROFILE.split(2) == [(0, 4), (4, 6)]
    assert PROFILE.split(3) == [(0, 4), (4, 5), (5, 6)]  # 0.031 | 0.030 | 0.002
    with pytest.raises(ValueError, match="cannot split 6 profiled layers into 7"):
        PROFILE.split(7)


def test_measured_stage_latencies_and_memory():
    c = MeasuredCostModel(PROFILE).costs(PROFILE.spec(), 2, 1)
    assert c.stage_latency_s == pytest.approx([0.031 + 0.0005, 0.032])  # every stage but the last sends on
    assert c.memory_per_device_gb == pytest.approx(130 / 1e9)  # the bigger stage: embedding + three layers
    assert MeasuredCostModel(PROFILE).costs(PROFILE.spec(), 1, 1).latency_s == pytest.approx(0.063)
    assert not MeasuredCostModel(PROFILE).supports(2, 2)
    with pytest.raises(ValueError, match="no profile for model 'bert-1.3b'"):
        MeasuredCostModel(PROFILE).costs(MODEL_TABLE["bert-1.3b"], 1, 1)
    fallback = MeasuredCostModel(PROFILE, fallback=AnalyticCostModel())
    assert fallback.costs(MODEL_TABLE["bert-1.3b"], 1, 1).latency_s == pytest.approx(0.151)


def test_profile_round_trip_and_bad_files(tmp_path):
    path = tmp_path / "p.json"
    PROFILE.save(str(path))
    assert LayerProfile.load(str(path)) == PROFILE
    assert [n for n, _ in parse_models("toy:2", {"toy": PROFILE.spec()})] == ["toy#0", "toy#1"]
    path.write_text("{\"model\": 1}")
    with pytest.raises(ValueError, match="not a specserve profile"):
        LayerProfile.load(str(path))
    with pytest.raises(ValueError, match="cannot read profile"):
        LayerProfile.load(str(tmp_path / "missing.json"))
