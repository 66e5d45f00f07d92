import pytest

from specserve import SamplingParams


@pytest.mark.parametrize("kw", [dict(max_tokens=0), dict(max_tokens=-3), dict(top_p=1.5), dict(top_p=0),
                                dict(temperature=-1), dict(n=0), dict(top_k=-2)])
def test_nonsense_is_rejected(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_stop_string_normalised():
    assert SamplingParams(stop="\n\n").stop == ["\n\n"]


@pytest.mark.parametrize("kw, match", [
    (dict(temperature=float("nan")), "temperature must be a finite"),
    (dict(temperature=float("inf")), "temperature must be a finite"),
    (dict(top_p=float("nan")), "top_p"),
    (dict(top_k=2.5), "top_k must be an integer"),
    (dict(top_k=True), "top_k must be an integer"),
    (dict(stop=[""]), "non-empty strings"),
    (dict(stop=["ok", 3]), "non-empty strings"),
    (dict(stop=5), "stop must be a string or a list"),
    (dict(stop_token_ids=[1.5]), "stop_token_ids"),
    (dict(stop_token_ids="12"), "stop_token_ids"),
    (dict(seed=-1), "seed must be an integer in"),
    (dict(seed=2**70), "seed must be an integer in"),
    (dict(seed=2**63 - 1, n=2), "seed must be an integer in"),  # sample 1 would use 2**63
    (dict(seed=1.5), "seed must be an integer"),
    (dict(logprobs=21), "logprobs must be True/False or an integer k in"),
    (dict(logprobs=-1), "logprobs must be True/False or an integer k in"),
    (dict(prompt_logprobs=-1), "prompt_logprobs must be None or an integer k in"),
    (dict(prompt_logprobs=True), "prompt_logprobs must be None or an integer k in"),
    (dict(logprobs=2.0), "logprobs must be True/False or an integer k in"),
    (dict(max_tokens=2.0), "max_tokens must be an integer"),
    (dict(n=True), "n must be an integer"),
    (dict(n=3, best_of=2), "best_of must be an integer >= n"),
    (dict(best_of=2.0), "best_of must be an integer"),
    (dict(best_of_deadline_s=0), "best_of_deadline_s must be a number of seconds > 0"),
    (dict(best_of_deadline_s=float("inf")), "best_of_deadline_s"),
    (dict(seed=2**63 - 2, best_of=3), "seed must be an integer in"),  # sample 2 would use 2**63
])
def test_values_vllm_users_would_expect_refused_are_refused_in_one_line(kw, match):
    with pytest.raises(ValueError, match=match) as e:
        SamplingParams(**kw)
    assert "\n" not in str(e.value)


def test_edge_values_that_are_fine_stay_fine():
    p = SamplingParams(seed=0, top_k=0, stop=("a", "b"), stop_token_ids=(3,), temperature=0)
    assert p.stop == ["a", "b"] and p.stop_token_ids == [3] and p.greedy
    assert SamplingParams(seed=2**63 - 2, n=2).seed == 2**63 - 2
    assert (SamplingParams(logprobs=5).num_top_logprobs, SamplingParams(logprobs=True).num_top_logprobs) == (5, 0)
    assert SamplingParams(logprobs=0).wants_logprobs and not SamplingParams().wants_logprobs


@pytest.mark.parametrize("cls, kw, match", [
    ("CacheConfig", dict(block_size=0), "block_size must be an integer >= 1"),
    ("CacheConfig", dict(kv_cache_gib=0), "kv_cache_gib must be a finite number"),
    ("CacheConfig", dict(kv_cache_gib=-1.0), "kv_cache_gib"),
    ("CacheConfig", dict(kv_cache_gib=float("nan")), "kv_cache_gib"),
    ("CacheConfig", dict(num_blocks=0), "num_blocks"),
    ("SchedulerConfig", dict(max_num_seqs=0), "max_num_seqs must be an integer >= 1"),
    ("SchedulerConfig", dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    ("SchedulerConfig", dict(max_model_len=1), "max_model_len"),
])
def test_engine_configs_validate_their_fields(cls, kw, match):
    from specserve import config
    with pytest.raises(ValueError, match=match):
        getattr(config, cls)(**kw)


@pytest.mark.parametrize("kw, match", [(dict(beam=0), "beam must be"), (dict(beam=-3), "beam must be"),
                                       (dict(bucket_threshold=0.0), "bucket-threshold"), (dict(model_candidates=-1), "model-candidates"),
                                       (dict(max_op=0), "max-op")])
def test_planner_search_config_validates(kw, match):
    from specserve.planner.search import SearchConfig
    with pytest.raises(ValueError, match=match):
        SearchConfig(**kw)


@pytest.mark.parametrize("workload, match", [("gamma:rate=inf", "finite numbers > 0"), ("gamma:rate=1e12", "at most"),
                                             ("poisson:rate=-1", "finite numbers > 0"), ("gamma:rate=5,cv=nan", "finite"),
                                             ("gamma:rate=5,skew=-1", "skew >= 0"), ("gamma:rate=5,cvv=2", "unknown keys")])
def test_workloads_refuse_rates_that_cannot_be_simulated(workload, match):
    from specserve.planner.workload import parse_workload
    with pytest.raises(ValueError, match=match):
        parse_workload(workload, ["a"], 600.0, 0)


def test_per_request_speculation_switch():
    assert SamplingParams(speculative=False).speculative is False and SamplingParams().speculative is None
    for bad in (True, 0, "no"):
        with pytest.raises(ValueError, match="speculative must be None"):
            SamplingParams(speculative=bad)
