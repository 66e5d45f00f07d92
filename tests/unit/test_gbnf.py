"""GBNF grammars (llama.cpp's format) compile: llguidance 1.9 made gbnf_to_lark a module, and every
grammar with "::=" was a TypeError (an HTTP 500) until the function was imported from it."""
import pytest

from specserve.guided.grammar import lark_grammar


def test_gbnf_becomes_the_lark_grammar_it_means():
    out = lark_grammar('root ::= "yes" | "no"')
    assert out.split() == ["%llguidance", "{}", "start:", '"yes"', "|", '"no"']


def test_gbnf_with_a_bad_rule_is_a_value_error_not_a_type_error():
    with pytest.raises(Exception) as e:
        lark_grammar('root ::= "yes" | missing')
    assert not isinstance(e.value, TypeError)
