"""Guided generation on the embedded model: every output is valid against its schema (checked with
jsonschema), regex or choice, greedy and at temperature 1 (20 samples each); fast-forward changes
nothing in the output; with every drafter, greedy constrained output is identical with and without
speculation at batch 1 and 8; malformed or unsatisfiable constraints fail with one line, at submit;
one that reaches text the vocabulary cannot spell midway finishes alone, with "error" (issue 36)."""
import json
import re

import jsonschema
import pytest

from specserve import LLM, SamplingParams
from specserve_bench.guided_set import CHOICE, REGEX, SCHEMAS


def _chat(llm, text):
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": text}])


@pytest.mark.parametrize("name, schema, ask", SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_json_outputs_are_valid(embedded_llm, name, schema, ask):
    prompt = _chat(embedded_llm, ask)
    greedy = embedded_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=300, guided_json=schema))
    sampled = embedded_llm.generate(prompt, SamplingParams(temperature=1.0, n=20, seed=7, max_tokens=300, guided_json=schema))
    outs = greedy[0].outputs + sampled[0].outputs
    assert len(outs) == 21
    for o in outs:
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), schema, format_checker=jsonschema.FormatChecker())
        assert "grammar" in o.origins  # keys, separators and braces were fast-forwarded


def test_regex_and_choice_outputs_are_valid(embedded_llm):
    regex, ask = REGEX
    outs = embedded_llm.generate(_chat(embedded_llm, ask), SamplingParams(temperature=1.0, n=20, seed=3, guided_regex=regex))
    outs += embedded_llm.generate(_chat(embedded_llm, ask), SamplingParams(temperature=0, guided_regex=regex))
    for o in [o for r in outs for o in r.outputs]:
        assert re.fullmatch(regex, o.text), o.text
    choices, ask = CHOICE
    outs = embedded_llm.generate(_chat(embedded_llm, ask), SamplingParams(temperature=1.0, n=20, seed=3, guided_choice=choices))
    texts = {o.text for o in outs[0].outputs}
    assert texts <= set(choices) and len(texts) >= 2  # sampled: more than one answer turns up


def test_fast_forward_changes_nothing(embedded_llm):
    """Forced tokens appended without sampling are the tokens decoding gives (their constrained
    probability is 1): the same ids and text with and without fast-forward. (Seeded sampling draws
    no random number for a forced token, so its later draws differ: the same distribution, other draws.)"""
    plain = LLM(guided_fast_forward=False, kv_cache_gib=0.25)
    for name, schema, ask in SCHEMAS:
        params = SamplingParams(temperature=0, max_tokens=300, guided_json=schema)
        a = embedded_llm.generate(_chat(embedded_llm, ask), params)[0].outputs[0]
        b = plain.generate(_chat(plain, ask), params)[0].outputs[0]
        assert a.token_ids == b.token_ids and a.text == b.text, name
        assert "grammar" in a.origins and "grammar" not in b.origins


SPEC = {
    "draft": dict(method="draft"), "draft-tree": dict(method="draft", shape="tree"),
    "lookup-pad": dict(method="lookup", attention="pad"), "suffix": dict(method="suffix"),
    "lookahead": dict(method="lookahead"), "auto": dict(method="auto"),
    "staged": dict(method="staged", stages=["target", "lookup"], policy="fixed", draft_len=3),
}


@pytest.fixture(scope="module")
def guided_prompts(embedded_llm):
    asks = [ask for _, _, ask in SCHEMAS] + ["Describe your favourite book as JSON.", "A JSON object for a cat.",
                                             "Store a todo item as JSON."]
    schemas = [s for _, s, _ in SCHEMAS] + [SCHEMAS[0][1], SCHEMAS[2][1], SCHEMAS[1][1]]
    params = [SamplingParams(temperature=0, max_tokens=120, guided_json=s) for s in schemas]
    prompts = [_chat(embedded_llm, a) for a in asks]
    reference = [o.outputs[0].token_ids for o in embedded_llm.generate(prompts, params)]
    return prompts, params, reference


# these two in `make test-all` only (time on an AVX2-only Zen 3); each stays in test_speculative.py
FULL_ONLY = {"suffix", "auto"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.full) if n in FULL_ONLY else n for n in SPEC])
def test_greedy_constrained_speculation_equals_constrained_decoding(name, guided_prompts):
    prompts, params, reference = guided_prompts
    llm = LLM(speculative={**SPEC[name], "fallback": False}, kv_cache_gib=0.25, max_num_seqs=8)
    alone = [llm.generate(p, sp)[0].outputs[0].token_ids for p, sp in zip(prompts[:3], params[:3])]
    batch8 = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert alone == reference[:3]
    assert batch8 == reference
    assert llm.spec_stats()["accepted"] > 0


@pytest.mark.parametrize("params, message", [
    (dict(guided_regex="(("), "guided_regex: .*unclosed group"),
    (dict(guided_json={"type": "integer", "minimum": 5, "maximum": 3}), "guided_json: Unsatisfiable schema"),
    (dict(guided_json="{not json"), "guided_json: "),
    (dict(guided_grammar="start: foo"), "guided_grammar: .*unknown name"),
    (dict(guided_choice=[]), "guided_choice must be a non-empty list"),
    (dict(guided_regex="a", guided_choice=["a"]), "at most one guided constraint"),
    # issue 36: SmolLM2 has no token for the byte F1 (U+40000..U+7FFFF's first UTF-8 byte), forced here
    (dict(guided_regex="\U00040a89"), r"guided_regex: the constraint forces '\\U00040a89', which the model's "
                                      r"vocabulary cannot spell"),
])
def test_bad_constraints_fail_with_one_line(embedded_llm, params, message):
    with pytest.raises(ValueError, match=message) as e:
        embedded_llm.generate("hi", SamplingParams(max_tokens=8, **params))
    assert "\n" not in str(e.value)
    assert embedded_llm.generate("hi", SamplingParams(temperature=0, max_tokens=4))[0].outputs[0].token_ids  # still serving


DEAD_END = "[ab]\U00040a89"  # fine at its start; after a or b it forces the byte F1, which has no token


@pytest.mark.parametrize("config", ["fast-forward", "sampled", "speculative"])
def test_a_dead_end_midway_finishes_that_request_alone(embedded_llm, config):
    """Issue 36: a grammar that reaches text the vocabulary cannot spell finishes its request with
    finish_reason "error" (its text so far kept, a one-line why); the ordinary request beside it in
    the same generate call, and the same steps, completes as it does alone. The refused token comes
    from fast-forward, from a masked sample, or as a verify step's bonus token."""
    llm = {"fast-forward": lambda: embedded_llm,
           "sampled": lambda: LLM(guided_fast_forward=False, kv_cache_gib=0.25),
           "speculative": lambda: LLM(speculative={"method": "draft", "fallback": False}, guided_fast_forward=False,
                                      kv_cache_gib=0.25)}[config]()
    plain = SamplingParams(temperature=0, max_tokens=8)
    want = embedded_llm.generate("hi", plain)[0].outputs[0]
    bad, ok = llm.generate(["Answer a or b:", "hi"], [SamplingParams(temperature=0, max_tokens=8, guided_regex=DEAD_END), plain])
    out = bad.outputs[0]
    assert out.finish_reason == "error" and out.text in ("a", "b"), (out.finish_reason, out.text)
    assert out.error.startswith("guided_regex: the constraint requires text the model's vocabulary cannot spell")
    assert "\n" not in out.error
    assert ok.outputs[0].token_ids == want.token_ids and ok.outputs[0].finish_reason == want.finish_reason
    samples = llm.generate("Answer a or b:", SamplingParams(temperature=1.0, n=3, seed=1, guided_regex=DEAD_END))
    assert all(o.finish_reason == "error" and o.text in ("a", "b") for o in samples[0].outputs)
