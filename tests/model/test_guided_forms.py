"""Every grammar form (GBNF, Lark, regex, JSON Schema, choice) through `LLM.generate` (issue 36): a
valid grammar gives output that it accepts, a broken one a one-line ValueError (the server's 400),
never another exception (its 500). On a tiny random-weight model with a byte-level tokenizer."""
import json
import re

import pytest

from specserve import LLM, SamplingParams

from .tiny import make_tiny

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny") / "llama")
    make_tiny("llama", path)
    cfg = json.load(open(f"{path}/config.json"))
    json.dump({**cfg, "eos_token_id": EOS}, open(f"{path}/config.json", "w"))  # a grammar ends on EOS
    return LLM(path, kv_cache_gib=0.01, block_size=4, prefill_chunk=None)


def test_a_model_without_eos_refuses_guided_requests_in_one_line(tmp_path):
    make_tiny("llama", path := str(tmp_path / "no-eos"))
    with pytest.raises(ValueError, match="^guided generation needs a model whose tokenizer has an end-of-sequence token$"):
        LLM(path, kv_cache_gib=0.01, block_size=4, prefill_chunk=None).generate([[1, 2]], SamplingParams(guided_regex="a"))


EOS = 255
YES_NO = re.compile(r"yes|no")
GOOD = {
    "gbnf": (dict(guided_grammar='root ::= "yes" | "no"'), YES_NO.fullmatch),
    "lark": (dict(guided_grammar='start: "yes" | "no"'), YES_NO.fullmatch),
    "regex": (dict(guided_regex=r"[0-9]{3}-[a-c]{2}"), re.compile(r"[0-9]{3}-[a-c]{2}").fullmatch),
    "json": (dict(guided_json={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                               "additionalProperties": False}),
             lambda text: isinstance(json.loads(text)["n"], int)),
    "choice": (dict(guided_choice=["red", "green", "blue"]), lambda text: text in ("red", "green", "blue")),
}
BAD = {
    "gbnf-undefined-rule": dict(guided_grammar='root ::= "yes" | missing'),
    "gbnf-unclosed-string": dict(guided_grammar='root ::= "yes'),
    "lark-undefined-rule": dict(guided_grammar="start: missing"),
    "lark-garbage": dict(guided_grammar="start: ::: ((("),
    "regex-unbalanced": dict(guided_regex="(ab"),
    "json-not-json": dict(guided_json="{not json"),
    "json-bad-type": dict(guided_json={"type": "nonsense"}),
    "choice-empty": dict(guided_choice=[]),
    "two-forms": dict(guided_regex="a", guided_choice=["a"]),
}


@pytest.mark.parametrize("form", list(GOOD))
def test_every_grammar_form_constrains_the_output(llm, form):
    kwargs, accepts = GOOD[form]
    outs = llm.generate([[1, 2, 3]], SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=40, **kwargs))[0].outputs
    for o in outs:
        assert o.finish_reason == "stop" and accepts(o.text), (form, o.text)


@pytest.mark.parametrize("case", list(BAD))
def test_a_broken_grammar_is_a_one_line_value_error(llm, case):
    with pytest.raises(ValueError) as e:  # any other exception type is the server's 500
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8, **BAD[case]))
    assert str(e.value) and "\n" not in str(e.value), str(e.value)
    assert llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8, **GOOD["gbnf"][0]))[0].outputs[0].text in ("yes", "no")
