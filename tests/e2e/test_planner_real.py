"""Real execution: the embedded model as pipeline stages on processes joined by torch.distributed."""
import numpy as np
import pytest
import torch

from specserve.planner.placement import GroupPlan
from specserve.planner.simulator import Trace

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profile():
    from specserve.planner.real.profile import profile_model
    return profile_model(tokens=8, reps=2, gap_s=0.0)


def test_profile_covers_every_unit(profile):
    from specserve.planner.cost_model import MeasuredCostModel
    assert len(profile.layer_s) == len(profile.layer_bytes) == 30 + 2  # embedding, 30 layers, head
    assert all(t > 0 for t in profile.layer_s) and 0 < profile.boundary_s < 0.05
    two = MeasuredCostModel(profile).costs(profile.spec(), 2, 1)
    assert two.latency_s == pytest.approx(profile.latency_s + profile.boundary_s)


@pytest.mark.parametrize("placement", [
    [GroupPlan([0, 1], 2, 1, ["a", "b"])],                           # both models, 2-stage pipeline
    [GroupPlan([0], 1, 1, ["a"]), GroupPlan([1], 1, 1, ["b"])],      # one model per process
])
def test_every_request_comes_back_with_the_whole_models_next_token(profile, placement):
    from specserve.planner.real.runner import run_placement
    from specserve.planner.real.stages import PipelineStage, load_model, num_units
    arrival = np.linspace(0.0, 1.5, 8)
    trace = Trace(arrival, np.array([0, 1] * 4), ["a", "b"])
    res = run_placement(placement, trace, {"a": 60.0, "b": 60.0}, profile, seed=3)
    assert not np.isnan(res.finish).any() and res.slo_attainment == 1.0
    assert np.all(res.finish > arrival)
    # the pipeline computes exactly what one process running the whole model computes
    model = load_model()
    prompt = torch.randint(0, 1000, (profile.tokens,), generator=torch.Generator().manual_seed(3))
    expected = int(PipelineStage(model, 0, num_units(model), profile.tokens).run(prompt)[0])
    assert set(res.tokens.tolist()) == {expected}
    assert {d: len(v) for d, v in res.stage_s.items()} == (
        {0: 8, 1: 8} if len(placement) == 1 else {0: 4, 1: 4})


def test_real_runner_refuses_intra_op_groups(profile):
    from specserve.planner.real.runner import run_placement
    with pytest.raises(ValueError, match="pipelines only"):
        run_placement([GroupPlan([0, 1], 1, 2, ["a"])], Trace(np.zeros(1), np.zeros(1, dtype=np.int64), ["a"]),
                      {"a": 1.0}, profile)


def test_replay_under_torchrun(profile, tmp_path):
    """The same replay, one process per rank started by torchrun (as across machines)."""
    import json
    import os
    import subprocess
    import sys
    path = tmp_path / "profile.json"
    profile.save(str(path))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "3", "-m", "specserve.cli.main", "plan", "replay",
                        "--profile", str(path), "--placements", "pipeline", "--workloads", "poisson:rate=2",
                        "--duration", "3", "--out", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    row, = json.loads(next(tmp_path.glob("replay-*.json")).read_text())["rows"]
    assert row["placement"] == "pipeline" and row["real_slo_attainment"] == 1.0 and row["real_mean_latency_s"] > 0
