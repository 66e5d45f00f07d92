"""Guided generation's grammars: a request's constraint (SamplingParams.guided()) compiled once per
(kind, text) for the engine's tokenizer, and a `Guide` per sequence that says which tokens may come
next, which tokens are forced, and takes tokens (and gives them back, for rejected drafts).

The grammar engine is llguidance (Microsoft's Rust implementation of constrained decoding, the one
behind vLLM's and SGLang's "guidance" backends). It was chosen over xgrammar by measuring both on this
CPU with this tokenizer (`specserve bench guided`; docs/decisions.md#grammar-engine). xgrammar computes a
mask faster, but both take a small fraction of a decode step. llguidance compiles a schema much
faster, and it computes forced tokens (fast-forward) itself. It also installs as one 3 MB wheel with
no dependencies, where xgrammar requires triton. Torch-free: the masks are int32 bitmasks that
sampling/guided.py applies to the logits."""
from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Sequence

from ..registry import GUIDED

CACHE_SIZE = 256  # compiled grammars kept (LRU)


def grammar_text(kind: str, value) -> str:
    """The llguidance grammar for one constraint (registry.GUIDED names the kinds and their builders
    below), or a one-line ValueError."""
    try:
        return GUIDED.get(kind)(value)
    except (TypeError, AttributeError, ImportError, NameError):
        raise  # our bug, not the request's (a 500 that says so)
    except Exception as e:  # llguidance's parse errors are plain Exceptions and GbnfToLarkError, not ValueError
        raise ValueError(f"guided_{kind}: {_one_line(e)}") from None


# JSON as Python's json.dumps writes it: no free whitespace, so that everything but the values (keys,
# separators, braces, the rest of an enum) is forced by the schema and fast-forwarded. Free whitespace
# (llguidance's default) lets the model choose between indentations at every key, which forces nothing.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_grammar(schema) -> str:
    import llguidance
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)


def json_object_grammar(_value=None) -> str:
    return json_grammar('{"type": "object"}')


def regex_grammar(regex: str) -> str:
    import llguidance
    return llguidance.LLMatcher.grammar_from_regex(regex)


def choice_grammar(choices) -> str:
    return regex_grammar("|".join(re.escape(c) for c in choices))


def lark_grammar(text: str) -> str:
    """A Lark grammar, or GBNF (llama.cpp's format, recognised by its "::=")."""
    import llguidance
    from llguidance.gbnf_to_lark import gbnf_to_lark  # a module of that name since 1.9: import the function
    return llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(text) if "::=" in text else text)


def _one_line(e) -> str:
    return " ".join(str(e).split())[:300]


class GrammarCompiler:
    """One per engine: the tokenizer in llguidance's form (~0.5 s to build, once) and the compiled
    grammars, cached by constraint (a multi-turn chat or a fleet of clients send the same schema)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size  # the masks' width (the model's logits may be wider)
        self._lltok = None
        self._cache: OrderedDict = OrderedDict()

    @property
    def lltokenizer(self):
        if self._lltok is None:
            import llguidance
            t = self.tokenizer
            if not t.eos_token_ids:  # a grammar ends by allowing only EOS
                raise ValueError("guided generation needs a model whose tokenizer has an end-of-sequence token")
            self._lltok = llguidance.LLTokenizer(t.backend.to_str(), n_vocab=t.vocab_size, eos_token=t.eos_token_ids[0])
        return self._lltok

    def guide(self, kind: str, value) -> "Guide":
        """A fresh Guide for one sequence; a one-line ValueError for a malformed or unsatisfiable
        constraint (raised when the request is added, never midway)."""
        import llguidance
        key = (kind, value if isinstance(value, str) else json.dumps(value, sort_keys=True))
        m = self._cache.get(key)
        if m is None:
            grammar = grammar_text(kind, value)
            m = llguidance.LLMatcher(self.lltokenizer, grammar, log_level=0)
            if m.is_error():
                raise ValueError(f"guided_{kind}: {_one_line(m.get_error())}")
            g = Guide(m.deep_copy(), self.vocab_size, kind)
            if not g.allowed_any():
                raise ValueError(f"guided_{kind}: the constraint allows no text at all (unsatisfiable)")
            if (why := g.unspellable()) is not None:
                raise ValueError(f"guided_{kind}: {why}")
            self._cache[key] = m
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return Guide(m.deep_copy(), self.vocab_size, kind)


class Guide:
    """One sequence's place in its grammar: what may come next (`fill_mask`), what must come next
    (`forced`), and `accept` / `rollback` as tokens are emitted or drafts are tried."""

    def __init__(self, matcher, vocab_size: int, kind: str = ""):
        self.m = matcher
        self.vocab_size = vocab_size  # the tokenizer's: the bitmask's width in bits
        self.kind = kind  # the constraint's kind (SamplingParams.guided_<kind>), for messages

    @property
    def done(self) -> bool:
        """The grammar is complete: only EOS may follow (or it stopped on an error)."""
        return self.m.is_stopped()

    @property
    def error(self) -> str:
        return self.m.get_error()

    def refusal(self, token: int) -> str:
        """One line for a token the grammar refused although its mask allowed it (the guide is in error
        since): a dead end, where the text the grammar requires has no spelling in the vocabulary."""
        first = next((line for line in self.error.splitlines() if line.strip()), "")
        return (f"guided_{self.kind}: the constraint requires text the model's vocabulary cannot spell "
                f"(the grammar refused token {token}: {_one_line(first)})")

    def unspellable(self) -> "str | None":
        """Why the text the grammar forces from here cannot be written with the vocabulary's tokens, or
        None. Some byte-level vocabularies lack tokens for a few bytes (SmolLM2 has none for F1, the
        first byte of U+40000..U+7FFFF): llguidance then forces tokens for the bytes around the missing
        one, and refuses the first of them. State unchanged."""
        forced = self.forced()
        if self.valid_prefix(forced) == len(forced):
            return None
        text = bytes(self.m.compute_ff_bytes()).decode("utf-8", errors="replace")
        return f"the constraint forces {ascii(text)}, which the model's vocabulary cannot spell (no token for one of its bytes)"

    def fill_mask(self, bitmask, row: int) -> None:
        """bitmask [rows, ceil(vocab / 32)] int32 (torch): row gets the tokens allowed next."""
        from llguidance.torch import fill_next_token_bitmask
        fill_next_token_bitmask(self.m, bitmask, row)

    def allowed_any(self) -> bool:
        from llguidance.torch import allocate_token_bitmask
        mask = allocate_token_bitmask(1, self.vocab_size)
        self.fill_mask(mask, 0)
        return bool(mask.any())

    def accept(self, tokens: Sequence[int]) -> bool:
        """Take emitted tokens; False (and the guide in error) if the grammar refuses one."""
        return self.m.consume_tokens(list(tokens))

    def advance(self, tokens: Sequence[int]) -> int:
        """Take as many of tokens, in order, as the grammar allows; returns how many (roll them back
        with rollback)."""
        return self.m.try_consume_tokens(list(tokens)) if tokens else 0

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of tokens, in order, the grammar allows from here (state unchanged)."""
        return self.m.validate_tokens(list(tokens))

    def rollback(self, n: int) -> None:
        if n and not self.m.rollback(n):
            raise RuntimeError(f"grammar rollback of {n} tokens failed: {self.error}")

    def forced(self) -> list[int]:
        """Tokens the grammar allows one way only from here (fast-forward), in order."""
        return self.m.compute_ff_tokens()
