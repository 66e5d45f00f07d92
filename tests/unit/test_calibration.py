"""The cost model's start-up calibration: taken short, and taken again when the steps served since show
it was disturbed (a busy machine at start-up kept drafting off for a whole session: issue 40); the
prefill chunk's measurement."""
from specserve.kv.block_manager import BlockManager
from specserve.speculative import Calibrator, CostModel
from specserve.speculative.calibration import RETAKES, measure_prefill_chunk


def curve(model: CostModel, one_row: float) -> None:
    for rows in (1, 2, 4, 8, 16, 32):
        model.record_calibration(rows, one_row * (1 + 0.3 * (rows - 1)))


def test_a_calibration_above_the_plain_steps_is_disturbed_only_after_enough_steps():
    c = CostModel()
    curve(c, 0.040)  # taken busy: 40 ms a bare one-row pass
    for _ in range(7):
        c.record_target(1, 0.025, batch=1)  # quiet now: 25 ms whole steps
        assert not c.calibration_disturbed()  # too few steps to trust
    c.record_target(1, 0.025, batch=1)
    assert c.calibration_disturbed()
    quiet = CostModel()
    curve(quiet, 0.024)
    for _ in range(20):
        quiet.record_target(1, 0.025, batch=1)  # a whole step above its bare pass: as it should be
    assert not quiet.calibration_disturbed()
    assert not CostModel().calibration_disturbed()  # nothing calibrated, nothing to retake


def test_the_calibrator_retakes_a_disturbed_calibration_a_bounded_number_of_times():
    c = CostModel()
    one_row = [0.040]  # what the next calibration measures

    def run():
        curve(c, one_row[0])

    cal = Calibrator(c, run)
    cal.take()
    assert c.calibrated[1] == 0.040
    for _ in range(10):
        c.record_target(1, 0.025, batch=1)
    one_row[0] = 0.022  # the machine is quiet at the retake
    assert cal.check() and cal.retakes == 1
    assert c.calibrated[1] == 0.022 and c.calibrated[32] < 0.040 * (1 + 0.3 * 31)  # the old curve is gone
    assert c.scale == {}  # ratios to the old curve went with it
    assert not cal.check()  # not disturbed any more
    one_row[0] = 0.5  # a machine so busy that every retake looks disturbed: retakes stop
    for _ in range(RETAKES + 3):
        c.reset_calibration()
        curve(c, 0.5)
        cal.check()
    assert cal.retakes == RETAKES


def test_a_retake_without_room_keeps_the_old_curve():
    c = CostModel()
    curve(c, 0.040)
    before = dict(c.calibrated)
    Calibrator(c, lambda: None).take()  # calibrate found no free blocks for its scratch table: it ran nothing
    assert c.calibrated == before


def _chunk(name: str, seconds, max_tokens: int = 256) -> tuple[int, list]:
    """measure_prefill_chunk over a stand-in timer: seconds(n, call) for the call-th pass of n tokens."""
    calls: list = []

    def time_fn(table, n, repeats):
        got = []
        for _ in range(repeats):
            calls.append(n)
            got.append(seconds(n, calls.count(n)))
        return min(got)
    return measure_prefill_chunk((name,), None, None, BlockManager(64, 16), max_tokens, time_fn=time_fn), calls


def test_a_flat_pass_cost_gives_the_largest_chunk_though_each_sizes_first_pass_is_slow():
    """On a GPU a prompt pass costs about the same up to 256 tokens, but a size's first pass pays for
    the library's kernel pick: timed once a size, 32 tokens looked no faster per token than 16 and the
    chunk stayed at 16. Each size is timed twice and the faster kept."""
    chunk, calls = _chunk("flat", lambda n, call: 1e-3 * (3 if call == 1 else 1))
    assert chunk == 256
    assert calls.count(32) == 2
    assert _chunk("flat-capped", lambda n, call: 1e-3, max_tokens=64)[0] == 64


def test_a_pass_cost_linear_in_its_tokens_gives_the_smallest_chunk():
    """On a CPU a pass past a few rows costs in proportion to its tokens: no size is faster per token,
    and the search stops after the second."""
    chunk, calls = _chunk("linear", lambda n, call: 1e-4 * n)
    assert chunk == 16
    assert set(calls) == {16, 32}
