"""The planner's LLM mode: step pricing, the continuous-batching simulator by hand, and the
speculation-aware search on a tiny synthetic profile."""
import math

import numpy as np
import pytest

from specserve.planner.llm import LLMSLO, DraftSpec, Generation, LLMDevice, PassProfile, simulate_llm, step_choice
from specserve.planner.llm_search import plan_llm

# pass(n) = 10 ms + 1 ms per token: a small model that is compute-bound from the first token
LINEAR = PassProfile("t", [1, 1001], [0.011, 1.011], weights_gb=0.1, kv_gb_per_token=1e-4)
# memory-bound up to 16 tokens (a pass reads the weights once), then compute-bound
ROOFLINE = PassProfile("t", [1, 16, 1024], [0.010, 0.010, 0.640], weights_gb=0.1, kv_gb_per_token=1e-4)
DRAFT = DraftSpec(alpha=0.5, c=0.1, weights_gb=0.01, kv_gb_per_token=0.0, max_len=1)
SLO = {"a": LLMSLO(10.0, 1.0), "b": LLMSLO(10.0, 1.0)}


def test_pass_profile_interpolates_extrapolates_and_never_gets_cheaper():
    assert LINEAR.pass_s(501) == pytest.approx(0.511)
    assert LINEAR.pass_s(2001) == pytest.approx(2.011)  # linear beyond the last point
    noisy = PassProfile("t", [1, 8, 16], [0.01, 0.05, 0.03], 0.1, 1e-4)
    assert noisy.pass_s(16) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="increasing"):
        PassProfile("t", [4, 2], [0.1, 0.2], 0.1, 1e-4)


def test_speculation_is_priced_per_batch_size():
    draft = DraftSpec(alpha=0.8, c=0.1, weights_gb=0.01, kv_gb_per_token=0.0)
    assert draft.expected_tokens(3) == pytest.approx((1 - 0.8 ** 4) / 0.2)
    k, seconds, gain = step_choice(ROOFLINE, draft, 1)
    # batch 1: k drafts cost 1 ms each and the verify of k + 1 <= 16 tokens is as cheap as one token
    assert k >= 3 and seconds == pytest.approx(k * 0.001 + ROOFLINE.pass_s(k + 1)) and gain > 2
    assert step_choice(ROOFLINE, draft, 256)[0] == 0  # compute-bound: verifying costs more than it saves
    assert step_choice(ROOFLINE, None, 1) == (0, pytest.approx(0.010), 1.0)


def test_one_generation_by_hand():
    """prompt 100, output 3: prefill 0.110 s (first token), then two decode steps of 0.011 s."""
    res = simulate_llm([LLMDevice(["a"])], [Generation(0.0, "a", 100, 3)], {"a": LINEAR}, {}, SLO, 1.0)
    assert res.ttft[0] == pytest.approx(0.110) and res.tpot[0] == pytest.approx(0.011)
    assert res.steps == 3 and res.good[0]


def test_a_draft_speeds_the_decode_steps_by_hand():
    """alpha 0.5, k = 1: a step costs 0.1 x 0.011 + pass(2) = 0.0131 s and gains 1.5 tokens; the draft
    also prefills the prompt (0.1 x 0.110). Output 4: first token at 0.121, then 3 tokens in 2 steps."""
    assert step_choice(LINEAR, DRAFT, 1) == (1, pytest.approx(0.0131), pytest.approx(1.5))
    res = simulate_llm([LLMDevice(["a"], ["a"])], [Generation(0.0, "a", 100, 4)], {"a": LINEAR}, {"a": DRAFT},
                       SLO, 1.0)
    assert res.ttft[0] == pytest.approx(0.121)
    assert res.tpot[0] == pytest.approx(2 * 0.0131 / 3) and res.spec_steps == 2


def test_kv_memory_holds_back_admission():
    """Each generation reserves (100 + 3) x 1e-4 GB = 0.0103 GB; 0.115 GB - 0.1 GB of weights holds one.
    The second waits for the first (done at 0.132), then prefills: first token at 0.242."""
    gens = [Generation(0.0, "a", 100, 3), Generation(0.0, "a", 100, 3)]
    res = simulate_llm([LLMDevice(["a"])], gens, {"a": LINEAR}, {}, SLO, 0.115)
    assert res.ttft[1] == pytest.approx(0.132 + 0.110)
    roomy = simulate_llm([LLMDevice(["a"])], gens, {"a": LINEAR}, {}, SLO, 1.0)
    # the first starts alone at 0 (0.110); the second prefills beside its first decode: pass(101)
    assert roomy.ttft[1] == pytest.approx(0.110 + 0.111)
    # a generation no device can hold is not served (it would block its queue forever)
    huge = simulate_llm([LLMDevice(["a"])], [Generation(0.0, "a", 5000, 10)], {"a": LINEAR}, {}, SLO, 0.2)
    assert math.isnan(huge.ttft[0]) and huge.slo_attainment == 0.0
    with pytest.raises(ValueError, match="over its"):
        simulate_llm([LLMDevice(["a", "b"])], gens, {"a": LINEAR, "b": LINEAR}, {}, SLO, 0.15)


def test_routing_to_the_replica_with_fewest_generations():
    gens = [Generation(0.0, "a", 100, 50), Generation(0.01, "a", 100, 50), Generation(0.02, "b", 10, 2)]
    res = simulate_llm([LLMDevice(["a"]), LLMDevice(["a", "b"])], gens, {"a": LINEAR, "b": LINEAR}, {}, SLO, 1.0,
                       sharing="turns")
    assert res.ttft[0] == pytest.approx(0.110)  # device 0
    assert res.ttft[1] == pytest.approx(0.110)  # device 1, idle: not queued behind the first
    # b shares device 1 with a's replica: it runs when a's first step ends (turns alternate)
    assert res.ttft[2] == pytest.approx(0.120 - 0.02 + 0.020, abs=1e-9)


def test_replicas_on_one_device_share_it_at_once_or_in_turns():
    """a and b on one device, each a prompt of 100 and 3 tokens at t = 0 (pass(n) = 10 ms + 1 ms a token).
    processor: both prefills run at half speed (first tokens at 0.220), then both decode at once (2 x 11
    ms a token). turns: a's prefill, b's, then their decode steps alternate."""
    gens = [Generation(0.0, "a", 100, 3), Generation(0.0, "b", 100, 3)]
    dev, prof = [LLMDevice(["a", "b"])], {"a": LINEAR, "b": LINEAR}
    shared = simulate_llm(dev, gens, prof, {}, SLO, 1.0)  # "processor" is the default
    assert list(shared.ttft) == pytest.approx([0.220, 0.220]) and list(shared.tpot) == pytest.approx([0.022, 0.022])
    turns = simulate_llm(dev, gens, prof, {}, SLO, 1.0, sharing="turns")
    assert list(turns.ttft) == pytest.approx([0.110, 0.220])
    assert list(turns.tpot) == pytest.approx([(0.253 - 0.110) / 2, (0.264 - 0.220) / 2])
    with pytest.raises(ValueError, match="sharing"):
        simulate_llm(dev, gens, prof, {}, SLO, 1.0, sharing="fair")


def test_routing_counts_every_replica_on_a_device():
    """Two devices each holding a and b: a's generation takes device 0 (both idle, lower index); b's
    goes to device 1, where nothing runs, not to its own idle replica on device 0 (which shares a's time)."""
    both = [LLMDevice(["a", "b"]), LLMDevice(["a", "b"])]
    gens = [Generation(0.0, "a", 100, 50), Generation(0.01, "b", 100, 50)]
    res = simulate_llm(both, gens, {"a": LINEAR, "b": LINEAR}, {}, SLO, 1.0)
    assert res.ttft[0] == pytest.approx(0.110) and res.ttft[1] == pytest.approx(0.110)  # not 0.100 + 0.110


# LINEAR's decode steps, and a prefill curve of its own: 2 ms a prompt token, whole prompts or in chunks
CHUNKED = PassProfile("t", [1, 1001], [0.011, 1.011], 0.1, 1e-4, prefill_tokens=[16, 64], prefill_seconds=[0.032, 0.128])


def test_prefill_curve_chunks_and_served_costs():
    assert CHUNKED.prefill_s(8) == pytest.approx(0.016)  # proportional below the first point
    assert CHUNKED.prefill_s(128) == pytest.approx(0.256)  # linear beyond the last
    assert CHUNKED.chunk_s(16, 32) == pytest.approx(0.064 / 2)  # half of a 32-token prompt's prefill
    assert CHUNKED.fixed_s == pytest.approx(2 * 0.011 - 0.012)
    assert LINEAR.chunk_s(16, 32) == pytest.approx(LINEAR.pass_s(16)) and not LINEAR.chunked  # no curve: pass(n)
    served = PassProfile("t", [1, 2], [0.01, 0.02], 0.1, 1e-4, {"served": {"step_s": 0.001, "token_s": 0.0005}})
    assert served.served_s(4) == pytest.approx(0.003) and LINEAR.served_s(4) == 0.0
    with pytest.raises(ValueError, match="prefill curve"):
        PassProfile("t", [1, 2], [0.01, 0.02], 0.1, 1e-4, prefill_tokens=[64, 16], prefill_seconds=[0.1, 0.2])


def test_one_prompt_in_chunks_by_hand():
    """Prompt 64 in chunks of 16: four steps of 0.128 x 16 / 64 = 0.032 s, the first token with the
    last (0.128), then two decode steps of 0.011. Whole, the same prompt takes one step."""
    gen = [Generation(0.0, "a", 64, 3)]
    res = simulate_llm([LLMDevice(["a"])], gen, {"a": CHUNKED}, {}, SLO, 1.0, prefill_chunk=16)
    assert res.ttft[0] == pytest.approx(0.128) and res.tpot[0] == pytest.approx(0.011) and res.steps == 6
    whole = simulate_llm([LLMDevice(["a"])], gen, {"a": CHUNKED}, {}, SLO, 1.0)
    assert whole.ttft[0] == pytest.approx(CHUNKED.pass_s(64)) and whole.steps == 3


def test_decodes_go_first_and_a_prompt_rides_beside_them_by_hand():
    """A (prompt 16, 10 tokens) at 0: prefill 0.032, decodes of 0.011. B (prompt 32, 2 tokens) arrives at
    0.05, in A's third step (0.043-0.054); from 0.054 two steps carry A's decode and 16 of B's tokens:
    pass(1) + 0.064 x 16 / 32 - fixed (0.010) = 0.033 each, so B's first token at 0.120 (TTFT 0.070);
    then one step of both (pass(2) = 0.012) ends B, and A decodes alone: its 9 tokens by 0.176."""
    gens = [Generation(0.0, "a", 16, 10), Generation(0.05, "a", 32, 2)]
    res = simulate_llm([LLMDevice(["a"])], gens, {"a": CHUNKED}, {}, SLO, 1.0, prefill_chunk=16)
    assert res.ttft[0] == pytest.approx(0.032) and res.ttft[1] == pytest.approx(0.070)
    assert res.tpot[1] == pytest.approx(0.012) and res.tpot[0] == pytest.approx((0.176 - 0.032) / 9)
    # chunk 32: A's decode leaves B 31 prompt tokens a step, so its 64 take 31 + 31 + 2 (steps of 0.001 +
    # 0.002 a token): its first token at 0.054 + 2 x 0.063 + 0.005
    gens[1] = Generation(0.05, "a", 64, 2)
    res = simulate_llm([LLMDevice(["a"])], gens, {"a": CHUNKED}, {}, SLO, 1.0, prefill_chunk=32)
    assert res.ttft[1] == pytest.approx(0.185 - 0.05)


def test_served_costs_and_switching_by_hand():
    """Served: each step costs 1 ms more, and 0.5 ms more for each sequence streaming a token in it: the
    four chunks of a 64-token prompt take 0.128 + 4 x 0.001 + 0.0005 (the last streams the first token),
    a decode step 0.011 + 0.0015. Two replicas sharing a device, each stepping: 1 / (2 x 1.5) of its speed
    each with switch_cost 0.5, so two prefills of pass(64) = 0.074 end at 3 x 0.074."""
    served = PassProfile("t", CHUNKED.tokens, CHUNKED.seconds, 0.1, 1e-4, {"served": {"step_s": 0.001, "token_s": 0.0005}},
                         CHUNKED.prefill_tokens, CHUNKED.prefill_seconds)
    res = simulate_llm([LLMDevice(["a"])], [Generation(0.0, "a", 64, 3)], {"a": served}, {}, SLO, 1.0, prefill_chunk=16)
    assert res.ttft[0] == pytest.approx(0.1325) and res.tpot[0] == pytest.approx(0.0125)
    gens = [Generation(0.0, "a", 64, 1), Generation(0.0, "b", 64, 1)]
    dev, prof = [LLMDevice(["a", "b"])], {"a": LINEAR, "b": LINEAR}
    assert list(simulate_llm(dev, gens, prof, {}, SLO, 1.0, switch_cost=0.5).ttft) == pytest.approx([0.222, 0.222])
    assert list(simulate_llm(dev, gens, prof, {}, SLO, 1.0).ttft) == pytest.approx([0.148, 0.148])
    alone = simulate_llm([LLMDevice(["a"])], gens[:1], prof, {}, SLO, 1.0, switch_cost=0.5)
    assert alone.ttft[0] == pytest.approx(0.074)  # one replica stepping alone does not switch


@pytest.mark.parametrize("tpot_scale, draft_wins", [(0.9, True), (4.0, False)])
def test_search_places_a_draft_only_where_it_raises_attainment(tpot_scale, draft_wins):
    """Memory for one target and its draft, or two targets, per device. A TPOT below one plain step
    (0.9x) only a draft can meet; with a loose TPOT and heavy load the draft adds nothing."""
    profile = PassProfile("t", [1, 16, 1024], [0.010, 0.010, 0.640], weights_gb=0.1, kv_gb_per_token=1e-5)
    draft = DraftSpec(alpha=0.8, c=0.1, weights_gb=0.02, kv_gb_per_token=0.0)
    rng = np.random.default_rng(0)
    rate = 0.5 if draft_wins else 40.0
    times = np.cumsum(rng.exponential(1 / rate, 300 if not draft_wins else 60))
    gens = [Generation(float(t), "a", 64, 32) for t in times]
    slo = {"a": LLMSLO(2.0, tpot_scale * profile.pass_s(1))}
    kw = dict(models=["a"], num_devices=2, gens=gens, profiles={"a": profile}, drafts={"a": draft}, slo=slo,
              budget_gb=0.2)
    plain, aware = plan_llm(allow_drafts=False, **kw), plan_llm(allow_drafts=True, **kw)
    assert not any(d.drafts for d in plain.devices)
    if draft_wins:
        assert plain.result.slo_attainment == 0.0 and aware.result.slo_attainment > 0.5
        assert any(d.drafts for d in aware.devices)
    else:
        assert aware.result.slo_attainment == pytest.approx(plain.result.slo_attainment)
        assert aware.result.spec_steps < 0.5 * aware.result.steps


def test_azure_llm_trace_rows_become_generations(tmp_path):
    from specserve.planner.llm import llm_workload, load_llm_trace
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
                    "2023-11-16 18:15:47.0000000,0,0\n")
    gens = load_llm_trace(str(path), ["a", "b"])
    assert [(round(g.arrival, 3), g.prompt_tokens, g.output_tokens) for g in gens] == [
        (0.0, 374, 44), (0.319, 1, 1), (4.315, 396, 109)]
    assert {g.model for g in gens} == {"a", "b"}
    bad = tmp_path / "bad.csv"
    bad.write_text("when,prompt\n1,2\n")
    with pytest.raises(ValueError, match="TIMESTAMP, ContextTokens, GeneratedTokens"):
        load_llm_trace(str(bad), ["a"])
    # generated lengths sit around the Splitwise medians of the Azure conversation trace
    gens = llm_workload(["a", "b"], 50.0, 1.0, 100.0, 0)
    assert 900 < np.median([g.prompt_tokens for g in gens]) < 1150 and 110 < np.median([g.output_tokens for g in gens]) < 150


def test_the_spec_bench_default_is_the_newest_result_of_the_model_with_the_table(tmp_path):
    import json

    from specserve.cli.plan_llm import newest_spec_bench
    greedy = {"model": "small.gguf", "tables": {"greedy": []}}
    for name, r in (("spec-cpu-20261123-171653.json", greedy), ("spec-cpu-20261124-080855.json", greedy),
                    ("spec-cpu-20261124-072437.json", greedy),
                    ("spec-cpu-20261125-000000.json", {"model": "big.gguf", "tables": {"greedy": []}}),
                    ("spec-cpu-20261126-000000.json", {"model": "small.gguf", "tables": {"sampling": []}})):
        (tmp_path / name).write_text(json.dumps(r))
    pattern = str(tmp_path / "spec-cpu-*.json")
    assert newest_spec_bench(pattern, "small.gguf").endswith("spec-cpu-20261124-080855.json")
    assert newest_spec_bench(pattern).endswith("spec-cpu-20261125-000000.json")
    with pytest.raises(FileNotFoundError, match="--spec-bench"):
        newest_spec_bench(str(tmp_path / "none-*.json"))
