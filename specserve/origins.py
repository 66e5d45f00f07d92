"""Showing who proposed each output token (CompletionOutput.origins), as the staged speculative
decoding paper's Figure 3 does: the text cut into runs of one origin, coloured in a terminal (ANSI) or
on an HTML page. Torch-free; the CLI (`generate --show-origins`), the bench and the server's streamed
answers (the playground colours them) use it.

A token's text is what the incremental detokenizer emits when the token arrives (a token that ends
inside a UTF-8 character shows nothing and the next one carries the character), so the runs' texts
join up to exactly the output text."""
from __future__ import annotations

import html
from typing import Sequence

from .types import TokenOrigin

# (ANSI colour, HTML background) per origin; the target's own tokens stay plain.
STYLE = {
    TokenOrigin.TARGET: ("", "transparent"),
    TokenOrigin.DRAFT: ("\033[34m", "#cfe3ff"),  # blue
    TokenOrigin.LOOKUP: ("\033[32m", "#cdf5d3"),  # green
    TokenOrigin.NGRAM: ("\033[35m", "#f1d6f7"),  # magenta
    TokenOrigin.SUFFIX: ("\033[33m", "#fbeec2"),  # yellow
    TokenOrigin.LOOKAHEAD: ("\033[36m", "#c9f1f4"),  # cyan
    TokenOrigin.GRAMMAR: ("\033[2m", "#e4e4e4"),  # dim / grey: forced by the grammar
}
RESET = "\033[0m"


class OriginRuns:
    """runs() a step at a time (the server's streamed answers): push each delta's new tokens and
    origins, get their runs; the runs of all pushes join up to the whole output's text."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        from .loading.tokenizer import IncrementalDetokenizer
        self.detok = IncrementalDetokenizer(tokenizer, skip_special_tokens)
        self.ids: list[int] = []

    def push(self, token_ids: Sequence[int], origins: Sequence[str]) -> list[tuple[str, TokenOrigin]]:
        if len(token_ids) != len(origins):
            raise ValueError(f"{len(token_ids)} tokens but {len(origins)} origins")
        out: list[tuple[str, TokenOrigin]] = []
        for tok, origin in zip(token_ids, origins):
            origin = TokenOrigin(origin)
            self.ids.append(tok)
            text = self.detok.step(self.ids)
            if out and out[-1][1] == origin:
                out[-1] = (out[-1][0] + text, origin)
            elif text:
                out.append((text, origin))
        return out


def runs(tokenizer, token_ids: Sequence[int], origins: Sequence[str],
         skip_special_tokens: bool = True) -> list[tuple[str, TokenOrigin]]:
    """[(text, origin)] for consecutive tokens of one origin, in order."""
    return OriginRuns(tokenizer, skip_special_tokens).push(token_ids, origins)


def shares(origins: Sequence[str]) -> dict[str, float]:
    """Fraction of the tokens from each origin present."""
    n = len(origins) or 1
    return {o.value: sum(x == o.value for x in origins) / n for o in TokenOrigin if o.value in origins}


def legend_ansi(present: Sequence[str] = ()) -> str:
    shown = [o for o in TokenOrigin if not present or o.value in present]
    return "  ".join(f"{STYLE[o][0]}{o.value}{RESET if STYLE[o][0] else ''}" for o in shown)


def ansi(pieces: list[tuple[str, TokenOrigin]]) -> str:
    return "".join(f"{STYLE[o][0]}{t}{RESET}" if STYLE[o][0] else t for t, o in pieces)


def html_block(title: str, pieces: list[tuple[str, TokenOrigin]]) -> str:
    """One output as an HTML fragment: a heading and the text, each run on its origin's colour."""
    body = "".join(f'<span class="o-{o.value}" title="{o.value}">{html.escape(t)}</span>' for t, o in pieces)
    return f"<h3>{html.escape(title)}</h3>\n<pre>{body}</pre>\n"


def html_page(title: str, blocks: Sequence[str], note: str = "") -> str:
    css = "\n".join(f".o-{o.value} {{ background: {STYLE[o][1]}; }}" for o in TokenOrigin)
    legend = " ".join(f'<span class="o-{o.value}">{o.value}</span>' for o in TokenOrigin)
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>\n"
            f"<style>body {{ font-family: sans-serif; max-width: 60em; margin: 2em auto; }}\n"
            f"pre {{ white-space: pre-wrap; font-size: 14px; line-height: 1.5; }}\n{css}\n</style></head>\n"
            f"<body><h1>{html.escape(title)}</h1>\n<p>{html.escape(note)}</p>\n<p>Origin: {legend}</p>\n"
            + "".join(blocks) + "</body></html>\n")
