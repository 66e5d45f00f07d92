"""Offline training text: the Python standard library's source on this machine, and prompts cut from it.

Nothing is downloaded. The token file is what travels to another machine for training, so a run
elsewhere (another Python version) trains on exactly the same data.
"""
from __future__ import annotations

import ast
import os
import random
import sysconfig
import textwrap

import numpy as np


def stdlib_files() -> list[str]:
    """Every .py file of the running Python's standard library (tests and site-packages excluded), sorted."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "test", "tests", "idle_test", "__pycache__"))
        out += [os.path.join(d, f) for f in sorted(files) if f.endswith(".py")]
    return out


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return ""


def stdlib_modules():
    """(syntax tree, source lines with their ends) of every standard-library file that parses."""
    for path in stdlib_files():
        src = _read(path)
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError):
            continue
        yield tree, src.splitlines(keepends=True)


def build_corpus(tokenizer, max_tokens: int = 0, progress=None) -> np.ndarray:
    """Token ids of the stdlib files, each followed by EOS, [N] (all of it when max_tokens is 0); uint16
    when the vocabulary allows (the file is what travels)."""
    eos = tokenizer.eos_token_ids[:1]  # document separator (none for tokenizers without EOS)
    chunks, total = [], 0
    files = stdlib_files()
    for path in (progress(files, desc="tokenise stdlib", unit="file") if progress else files):
        text = _read(path)
        if not text.strip():
            continue
        ids = tokenizer.encode(text, add_special_tokens=False) + eos
        chunks.append(np.asarray(ids, dtype=np.uint32))
        total += len(ids)
        if max_tokens and total >= max_tokens:
            break
    tokens = np.concatenate(chunks)
    if tokenizer.vocab_size <= 65536:
        tokens = tokens.astype(np.uint16)
    return tokens[:max_tokens] if max_tokens else tokens


def function_prompts(max_prompts: int, seed: int = 0, max_chars: int = 1200, private: bool = False) -> list[str]:
    """Code-completion prompts shaped like HumanEval's (a function's signature and docstring), cut from
    stdlib functions that have a docstring (public ones; with `private`, _single-underscore ones too).
    The target's continuations become self-distillation data."""
    prompts = []
    for tree, lines in stdlib_modules():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
                continue
            doc = node.body[0]
            if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
                continue
            if len(node.body) < 2 or node.name.startswith("__" if private else "_"):
                continue
            # Methods are dedented into plain functions, as HumanEval's prompts are.
            text = textwrap.dedent("".join(lines[node.lineno - 1 - len(node.decorator_list):doc.end_lineno]))
            if 40 < len(text) <= max_chars:
                prompts.append(text)
    random.Random(seed).shuffle(prompts)
    return prompts[:max_prompts]
