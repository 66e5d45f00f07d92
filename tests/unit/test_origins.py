"""Token origins shown as text runs (specserve/origins.py): the runs join up to the decoded text, each
run holds one origin, and the ANSI and HTML renderings carry every run."""
import pytest

from specserve import origins as org
from specserve.types import TokenOrigin


class CharTokenizer:
    """Token i is chr(ord('a') + i); token 99 is the first byte of a two-byte character and token 98 its
    second (decode shows the replacement character until both have arrived)."""

    def decode(self, ids, skip_special_tokens=True):
        out, pending = "", False
        for t in ids:
            if t == 99:
                pending = True
            elif t == 98 and pending:
                out, pending = out + "é", False
            else:
                out += chr(ord("a") + t)
        return out + ("\ufffd" if pending else "")


def test_runs_join_to_the_text_and_hold_one_origin_each():
    ids = [0, 1, 2, 99, 98, 3, 4]
    origins = ["target", "draft", "draft", "lookup", "lookup", "lookup", "target"]
    pieces = org.runs(CharTokenizer(), ids, origins)
    assert "".join(t for t, _ in pieces) == CharTokenizer().decode(ids)
    assert pieces == [("a", TokenOrigin.TARGET), ("bc", TokenOrigin.DRAFT), ("éd", TokenOrigin.LOOKUP),
                      ("e", TokenOrigin.TARGET)]


def test_a_character_split_across_origins_goes_to_the_token_that_completes_it():
    pieces = org.runs(CharTokenizer(), [0, 99, 98], ["target", "target", "draft"])
    assert pieces == [("a", TokenOrigin.TARGET), ("é", TokenOrigin.DRAFT)]


def test_renderings_carry_every_run_and_shares_add_up():
    pieces = org.runs(CharTokenizer(), [0, 1, 2], ["target", "ngram", "lookup"])
    text = org.ansi(pieces)
    assert "a" in text and org.STYLE[TokenOrigin.NGRAM][0] + "b" in text and org.STYLE[TokenOrigin.LOOKUP][0] + "c" in text
    page = org.html_page("t", [org.html_block("x <y>", pieces)])
    assert '<span class="o-ngram" title="ngram">b</span>' in page and "x &lt;y&gt;" in page
    assert org.shares(["target", "draft", "draft", "target"]) == {"target": 0.5, "draft": 0.5}


def test_every_origin_has_a_style_and_mismatched_lengths_fail():
    assert set(org.STYLE) == set(TokenOrigin)
    with pytest.raises(ValueError, match="2 tokens but 1 origins"):
        org.runs(CharTokenizer(), [0, 1], ["target"])
    with pytest.raises(ValueError):
        org.runs(CharTokenizer(), [0], ["nobody"])
