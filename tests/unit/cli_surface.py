"""The CLI's user-facing surface as plain data: every option of the commands users script (flag names,
dest, default, choices, action) and the namespaces a set of command lines parse to (or the exit code
they are refused with). tests/unit/test_cli_surface.py compares it with data/cli_surface_0ae6532.json,
recorded at commit 0ae6532 (before the flags were generated from the config dataclasses):

    PYTHONPATH=. python -m tests.unit.cli_surface > tests/unit/data/cli_surface_0ae6532.json
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json

# The subcommands whose flags users' scripts pass.
COMMANDS = (("generate",), ("serve",), ("bench", "spec"), ("bench", "decode"), ("bench", "staged"),
            ("bench", "guided"), ("bench", "prefix"), ("bench", "sarathi"), ("bench", "nbest"), ("bench", "serve"))

# Command lines whose parsed values must not change (types, conversions, store_false flags, refusals).
LINES = (
    ["generate", "hi"],
    ["generate", "hi", "--threads", "2", "--kv-cache-gib", "0.5", "--prefill-chunk", "none", "--no-prefix-caching",
     "--no-cuda-graphs", "--no-fast-forward", "--check-tensors", "--no-check-memory", "--dtype", "float32",
     "--device", "cpu", "-n", "2", "--top-k", "5", "--stop", "a", "--stop", "b"],
    ["generate", "hi", "--prefill-chunk", "64"],
    ["generate", "hi", "--prefill-chunk", "auto"],
    ["generate", "hi", "--speculative", "lookahead", "--lookahead-window", "6", "--lookahead-ngram", "4",
     "--lookahead-guesses", "2", "--draft-len", "5", "--policy", "fixed", "--attention", "pad", "--no-fallback",
     "--shape", "tree", "--tree-top-k", "3", "--tree-beam", "2", "--tree-max-nodes", "9", "--stages", "target,lookup",
     "--lookup-max-ngram", "3", "--draft-model", "/tmp", "--ngram-model", "/tmp"],
    ["generate", "hi", "--regex", "[a-z]+"],
    ["generate", "hi", "--choice", "a,b"],
    ["generate", "hi", "--json-object"],
    ["generate", "hi", "--json-schema", "s.json"],
    ["generate", "hi", "--grammar", "g.lark"],
    ["generate", "hi", "--regex", "x", "--choice", "a"],  # mutually exclusive: refused
    ["generate", "hi", "--threads", "0"],
    ["generate", "hi", "--kv-cache-gib", "0"],
    ["generate", "hi", "--prefill-chunk", "0"],
    ["generate", "hi", "--speculative", "nope"],
    ["generate", "hi", "--dtype", "int8"],
    ["generate", "hi", "--fallback"],
    ["serve"],
    ["serve", "--port", "9000", "--max-num-seqs", "8", "--speculative", "draft", "--threads", "1", "--api-key", "k",
     "--max-n", "4", "--allowed-hosts", "*"],
    ["serve", "--max-num-seqs", "0"],
    ["bench", "spec"],
    ["bench", "spec", "--speculative", "lookup", "--no-ablations", "--threads", "2", "--batch-sizes", "1,2"],
    ["bench", "decode"],
    ["bench", "decode", "--threads", "1", "--kv-cache-gib", "2", "--no-prefix-caching"],
    ["bench", "staged", "--last", "ngram", "--no-threshold-table"],
    ["bench", "guided", "--speculative", "lookup"],
    ["bench", "sarathi", "--chunk", "64"],
    ["bench", "nbest", "--temperature", "0.5"],
    ["bench", "serve", "--arrivals", "gamma"],
    ["bench", "prefix", "--shared", "2"],
)


def _value(v):
    return v if isinstance(v, (str, int, float, bool, type(None), list)) else repr(v)


def _subparser(parser: argparse.ArgumentParser, path: tuple) -> argparse.ArgumentParser:
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def options(parser: argparse.ArgumentParser) -> dict:
    out = {}
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        key = " ".join(a.option_strings) or a.dest
        out[key] = {"dest": a.dest, "default": _value(a.default), "action": type(a).__name__,
                    "choices": list(a.choices) if a.choices is not None else None,
                    "nargs": _value(a.nargs), "required": a.required}
    return out


def parse(build_parser, line: list) -> dict:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = build_parser().parse_args(line)
    except SystemExit as e:
        return {"exit": e.code}
    return {k: _value(v) for k, v in sorted(vars(ns).items())}


def surface(build_parser) -> dict:
    root = build_parser()
    return {"options": {" ".join(c): options(_subparser(root, c)) for c in COMMANDS},
            "parsed": [{"line": line, "result": parse(build_parser, line)} for line in LINES]}


if __name__ == "__main__":
    from specserve.cli.main import build_parser
    print(json.dumps(surface(build_parser), indent=1, sort_keys=True))
