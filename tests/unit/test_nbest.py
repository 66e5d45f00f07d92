"""engine/nbest.py: which samples answer a ranked request (best_of, a time budget), in what order."""
from specserve.engine.nbest import mean_logprob, pick
from specserve.types import FinishReason, Request, SamplingParams


def group(params, samples):
    """samples: (finish reason or None, output logprobs) per sample."""
    out = []
    for i, (reason, lps) in enumerate(samples):
        r = Request(f"g-{i}", [1, 2], params, group_id="g", sample_index=i)
        r.output_token_ids = list(range(len(lps)))
        r.output_logprobs = list(lps)
        r.finish_reason = reason
        out.append(r)
    return out


STOP, LENGTH, DEADLINE = FinishReason.STOP, FinishReason.LENGTH, FinishReason.DEADLINE


def test_best_of_keeps_the_n_of_highest_mean_logprob_best_first():
    g = group(SamplingParams(n=2, best_of=4), [(STOP, [-1.0, -3.0]), (STOP, [-0.5]), (LENGTH, [-0.1, -0.2, -0.3, -0.2]),
                                               (STOP, [-0.7])])
    # means -2.0, -0.5, -0.2, -0.7; sums -4.0, -0.5, -0.8, -0.7: ranked by the mean, not the sum
    assert [r.sample_index for r in pick(g)] == [2, 1]
    assert abs(mean_logprob(g[2]) - (-0.2)) < 1e-12


def test_a_deadline_keeps_only_finished_samples_and_never_answers_empty():
    params = SamplingParams(n=3, best_of_deadline_s=1.0)
    g = group(params, [(DEADLINE, [-0.01]), (STOP, [-2.0]), (DEADLINE, [-0.02]), (STOP, [-1.0])])
    assert [r.sample_index for r in pick(g)] == [3, 1]  # fewer than n: the stopped ones are out even if likelier
    g = group(params, [(DEADLINE, [-3.0]), (DEADLINE, []), (DEADLINE, [-1.0]), (DEADLINE, [-2.0])])
    assert [r.sample_index for r in pick(g)] == [2, 3, 0]  # none finished: the stopped ones, ranked


def test_ties_go_to_the_lower_sample_index_and_unranked_params_keep_every_sample_in_order():
    g = group(SamplingParams(n=2, best_of=3), [(STOP, [-1.0]), (STOP, [-1.0]), (STOP, [-1.0])])
    assert [r.sample_index for r in pick(g)] == [0, 1]
    g = group(SamplingParams(n=3), [(STOP, [-3.0]), (STOP, [-1.0]), (LENGTH, [-2.0])])
    assert [r.sample_index for r in pick(g)] == [0, 1, 2]
