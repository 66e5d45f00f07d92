"""Names written once (issue 42, item 4): the flags come from the config dataclasses and the registries,
LLM(...)'s keywords from the flags (the same for generate and serve as before the flags were
generated), the guided kinds from registry.GUIDED, `specserve bench NAME` from one table."""
import dataclasses
import inspect

import pytest

from specserve.cli.bench import BENCHES
from specserve.cli.engine_args import guided_from_args, llm_kwargs, spec_from_args
from specserve.cli.main import build_parser
from specserve.config import CacheConfig, GuidedConfig, LoadConfig, ModelConfig, SchedulerConfig, SpeculativeConfig
from specserve.engine.llm import LLM
from specserve.registry import GUIDED, POLICIES, Registry, resolve
from specserve.types import SamplingParams

ENGINE_DEFAULTS = dict(model=None, dtype="auto", device="cpu", num_threads=None, kv_cache_gib=1.0,
                       enable_prefix_caching=True, prefill_chunk="auto", cuda_graphs=True, check_tensors=False,
                       check_memory=True, activations="fp32",  # activations: issue 37's mode, added since 0ae6532
                       cuda_rounds=16,  # issue 41's rounds on the GPU, added since
                       batch_invariant=False,  # issue 41's batch-invariant projections, added since
                       max_model_len=None,  # --max-model-len (vLLM's flag), added since
                       chat_template=None,  # --chat-template (vLLM's flag), added since
                       kv_cache_dtype="auto")  # --kv-cache-dtype (vLLM's flag), added since


def kwargs(line):
    args = build_parser().parse_args(line)
    return llm_kwargs(args, speculative=spec_from_args(args))


def test_generate_builds_the_llm_it_built_before():
    """The keywords of 0ae6532's cmd_generate, by name: no more, no fewer."""
    assert kwargs(["generate", "x"]) == {**ENGINE_DEFAULTS, "guided_fast_forward": True, "speculative": None}
    got = kwargs(["generate", "x", "--threads", "3", "--kv-cache-gib", "0.5", "--prefill-chunk", "none",
                  "--no-prefix-caching", "--no-cuda-graphs", "--no-fast-forward", "--check-tensors", "--dtype", "float32",
                  "--speculative", "lookup", "--policy", "fixed", "--draft-len", "3", "--activations", "int8"])
    assert got == {**ENGINE_DEFAULTS, "num_threads": 3, "kv_cache_gib": 0.5, "prefill_chunk": None,
                   "enable_prefix_caching": False, "cuda_graphs": False, "check_tensors": True, "dtype": "float32",
                   "guided_fast_forward": False, "speculative": got["speculative"], "activations": "int8"}
    spec = SpeculativeConfig.from_any(got["speculative"])
    assert (spec.method, spec.policy, spec.draft_len, spec.stages) == ("lookup", "fixed", 3, ("draft", "ngram"))


def test_serve_builds_the_llm_it_built_before():
    """0ae6532's serve keywords: the batch size too, guided fast-forward left at LLM's default."""
    assert kwargs(["serve"]) == {**ENGINE_DEFAULTS, "max_num_seqs": 64, "speculative": None}
    got = kwargs(["serve", "--max-num-seqs", "8", "--speculative", "draft", "--no-fallback"])
    assert got["max_num_seqs"] == 8 and got["speculative"]["method"] == "draft" and got["speculative"]["fallback"] is False


def test_a_bench_takes_the_same_engine_flags_and_its_own_settings():
    args = build_parser().parse_args(["bench", "decode", "--threads", "2", "--prefill-chunk", "32"])
    assert llm_kwargs(args, enable_prefix_caching=False) == {**ENGINE_DEFAULTS, "num_threads": 2, "prefill_chunk": 32,
                                                             "enable_prefix_caching": False}


def test_every_keyword_of_llm_is_a_config_field():
    """LLM(...)'s keywords are the config dataclasses' fields (GuidedConfig's prefixed guided_), so the
    docstring that points there is complete and a field cannot be added without its keyword."""
    fields = {f.name for cls in (ModelConfig, LoadConfig, CacheConfig, SchedulerConfig) for f in dataclasses.fields(cls)}
    fields |= {f"guided_{f.name}" for f in dataclasses.fields(GuidedConfig)} | {"speculative"}
    fields -= {"num_blocks"}  # EngineConfig(cache=CacheConfig(num_blocks=...)) only: LLM(...) sizes the cache in GiB
    assert set(inspect.signature(LLM.__init__).parameters) - {"self"} == fields


def test_every_flagged_field_has_its_flag_and_its_help():
    """A field made with options.option is a flag of generate (serve for the batch size) with the
    field's help; choices from a registry list its names."""
    helps = {a.dest: a for p in (_sub("generate"), _sub("serve")) for a in p._actions}
    for cls in (ModelConfig, LoadConfig, CacheConfig, SchedulerConfig, SpeculativeConfig, GuidedConfig, SamplingParams):
        for f in dataclasses.fields(cls):
            if "help" not in f.metadata:
                continue
            dest = f.name if f.name in helps else (f.metadata["flag"] or "")[2:].replace("-", "_")
            assert helps[dest].help.startswith(f.metadata["help"]), f.name
            if isinstance(f.metadata["choices"], Registry):
                assert tuple(helps[dest].choices) == f.metadata["choices"].names()
    assert tuple(helps["policy"].choices) == POLICIES.names()


def test_the_sampling_flags_are_samplingparams_fields_with_the_terminals_defaults():
    """generate and chat take SamplingParams' option fields as flags (types.py), greedy by default with
    their own max_tokens; every flag set reaches its field."""
    from specserve.cli.args import sampling_kwargs
    flagged = {f.name for f in dataclasses.fields(SamplingParams) if "help" in f.metadata}
    assert {"temperature", "top_p", "top_k", "max_tokens", "seed", "min_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty", "min_tokens"} <= flagged
    for cmd, max_tokens in (("generate", 128), ("chat", 512)):
        got = sampling_kwargs(build_parser().parse_args([cmd] + (["x"] if cmd == "generate" else [])))
        assert set(got) == flagged
        assert got == {**{f.name: f.default for f in dataclasses.fields(SamplingParams) if f.name in flagged},
                       "temperature": 0.0, "max_tokens": max_tokens}
    line = ["generate", "x", "--temperature", "0.7", "--top-p", "0.9", "--top-k", "5", "--max-tokens", "9",
            "--seed", "3", "--min-p", "0.1", "--repetition-penalty", "1.1", "--presence-penalty", "0.5",
            "--frequency-penalty", "-0.5", "--min-tokens", "2"]
    params = SamplingParams(**sampling_kwargs(build_parser().parse_args(line)))
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens, params.seed, params.min_p,
            params.repetition_penalty, params.presence_penalty, params.frequency_penalty, params.min_tokens) == \
        (0.7, 0.9, 5, 9, 3, 0.1, 1.1, 0.5, -0.5, 2)


def _sub(name):
    root = build_parser()
    return next(a for a in root._actions if a.dest == "command").choices[name]


@pytest.mark.parametrize("kind", GUIDED.names())
def test_every_guided_kind_has_a_flag_that_sets_its_field(kind, tmp_path):
    meta = GUIDED.meta(kind)
    given = {"file": str(tmp_path / "g.txt"), "text": "[a-z]+", "list": "a, b"}.get(meta["value"])
    (tmp_path / "g.txt").write_text('{"type": "object"}')
    line = ["generate", "x", meta["flag"]] + ([given] if given is not None else [])
    guided = guided_from_args(build_parser().parse_args(line))
    assert list(guided) == [f"guided_{kind}"]
    assert SamplingParams(**guided).guided()[0] == kind


def test_the_bench_table_names_every_bench_and_its_runner():
    bench = next(a for a in _sub("bench")._actions if a.dest == "bench")
    assert list(bench.choices) == list(BENCHES)
    for entry in BENCHES.values():
        module, _, attr = entry.run.partition(":")
        assert attr.startswith("run_") and module.startswith("specserve_bench.")
    assert callable(resolve(BENCHES["prefix"].run))  # a light module: its import proves the table's form


def test_a_placements_model_handle_takes_the_calls_the_server_makes_as_asyncllm_does():
    """The server calls one model interface: AsyncLLM's, and a placement's ModelReplicas
    (cluster/router.py) in its place; a parameter added to one and not the other is a 500 under
    `serve --placement` only."""
    from specserve.cluster.router import ModelReplicas
    from specserve.engine.async_llm import AsyncLLM
    for name in ("encode", "encode_chat", "check", "abort"):
        ours, theirs = (list(inspect.signature(getattr(c, name)).parameters) for c in (ModelReplicas, AsyncLLM))
        assert ours == theirs, name
