"""vLLM's bad_words: words the output must not contain.

A word w becomes token sequences ("forms"), as vLLM's SamplingParams.update_from_tokenizer makes them:
its text as written (leading space stripped) and, after a space, " " + w when that tokenises to as
many tokens with another first token (a word-initial form, as in the middle of a text). Then, for a
row whose output so far is O (a verify span's row: O plus the draft tokens on its path):

    l_t <- -inf   for each form (b_1 .. b_n) with t = b_n and O ending with b_1 .. b_{n-1}

(a one-token form is banned in every row). Only the output counts, not the prompt (vLLM's rule).
"""
from __future__ import annotations

from typing import Callable, Sequence

Form = tuple[int, ...]


def bad_word_forms(words: Sequence[str], encode: Callable[[str], list[int]]) -> tuple[Form, ...]:
    """The forms of each word (the module docstring), in order, each once. encode: text -> token ids
    without special tokens."""
    forms: list[Form] = []
    for word in words:
        plain = tuple(encode(word.lstrip()))
        spaced = tuple(encode(" " + word.lstrip()))
        forms.append(plain)
        if plain and spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            forms.append(spaced)
    return tuple(dict.fromkeys(f for f in forms if f))


def banned(output: Sequence[int], paths: Sequence[tuple[int, ...]], forms: Sequence[Form]) -> list[tuple[int, int]]:
    """(row, token) cells to set to -inf: row 0 after `output`, row j + 1 after output + paths[j]."""
    longest = max(len(f) for f in forms) - 1
    tail = list(output[-longest:]) if longest else []
    cells = []
    for row, path in enumerate([()] + list(paths)):
        context = (tail + list(path))[-longest:] if longest else []
        for f in forms:
            n = len(f) - 1
            if n <= len(context) and (n == 0 or context[-n:] == list(f[:-1])):
                cells.append((row, f[-1]))
    return cells
