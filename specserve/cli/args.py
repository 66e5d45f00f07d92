"""argparse types that reject bad values with one line, and config dataclasses as flags (shared by
every subcommand). Stdlib only: the parser is built before torch is imported."""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, Callable, Iterable, Optional

from ..registry import MODELS, Registry


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        print(f"specserve: error: {message}", file=sys.stderr)
        sys.exit(2)


def _checked(convert, ok, rule: str):
    """An argparse type: convert, then reject values that break `rule` with one line (argparse would
    name this function in its own message for a value that does not convert: "invalid parse value")."""
    def parse(s: str):
        try:
            v = convert(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {rule}, got {s!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {v}")
        return v
    return parse


positive_int = _checked(int, lambda v: v >= 1, "an integer >= 1")
top_p = _checked(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
temperature = _checked(float, lambda v: 0 <= v < float("inf"), "a finite number >= 0")
positive_float = _checked(float, lambda v: 0 < v < float("inf"), "a finite number > 0")
unit = _checked(float, lambda v: 0 <= v <= 1, "a number in [0, 1]")
penalty = _checked(float, lambda v: -2 <= v <= 2, "a number in [-2, 2]")


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    """The SamplingParams flags generate and chat share (types.py's option fields), greedy by default at the
    terminal: the server's default temperature is 1.0, as OpenAI's."""
    from ..types import SamplingParams
    add_dataclass_args(p, SamplingParams, defaults={"max_tokens": max_tokens, "temperature": 0.0})


def sampling_kwargs(args) -> dict:
    """add_sampling_args's flags as SamplingParams keyword arguments."""
    from ..types import SamplingParams
    return dataclass_values(args, SamplingParams)


def model_path(s: str) -> str:
    """A file or directory, or a known model's name (pulled on first use)."""
    if not os.path.exists(s) and s not in MODELS:
        raise argparse.ArgumentTypeError(f"{s}: no such file or directory, and not a known model "
                                         f"({', '.join(MODELS.names())}; see specserve models)")
    return s


def prefill_chunk(text: str):
    """auto, none (None: whole prompts) or a number of tokens."""
    if text in ("auto", "none"):
        return None if text == "none" else text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be auto, none or an integer >= 1, got {text!r}") from None


# The argparse types a config field's `parse` names (options.option).
PARSERS: dict[str, Callable[[str], Any]] = {
    "positive_int": positive_int, "positive_float": positive_float, "model_path": model_path,
    "prefill_chunk": prefill_chunk, "temperature": temperature, "top_p": top_p, "unit": unit, "penalty": penalty}
# a field's annotation (a string: `from __future__ import annotations`) -> its argparse type
_BY_TYPE = {"int": int, "float": float, "Optional[int]": int, "Optional[float]": float}


def flag_of(f: dataclasses.Field) -> Optional[tuple[str, str]]:
    """(flag, dest) of a field made with options.option, None for the others. The dest is argparse's own
    (from the flag's name), except for "--no-x" flags, which store into the field's name."""
    if "help" not in f.metadata:
        return None
    flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
    negative = flag.startswith("--no-") and str(f.type) == "bool"
    return flag, f.name if negative else flag[2:].replace("-", "_")


def _flags(config_cls, skip: Iterable[str]):
    for f in dataclasses.fields(config_cls):
        fd = flag_of(f)
        if fd is not None and f.name not in skip:
            yield f, fd[0], fd[1]


def add_dataclass_args(p: argparse.ArgumentParser, config_cls, skip: Iterable[str] = (),
                       defaults: Optional[dict[str, Any]] = None) -> None:
    """One flag per field made with options.option (`max_n` -> `--max-n`), its default the field's (or
    defaults[field], this command's own):
    bools as --x/--no-x (or only --no-x where that is the field's flag), ints and floats typed, anything
    else (str, Optional[str]) as a string unless the field names a parser; tuples as "a,b"."""
    for f, flag, dest in _flags(config_cls, skip):
        m, help = f.metadata, f.metadata["help"]
        if str(f.type) == "bool":
            if dest == f.name and flag.startswith("--no-"):
                p.add_argument(flag, dest=dest, action="store_false", help=help)
            else:
                p.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=f.default, help=help)
            continue
        choices = m.get("choices")
        if isinstance(choices, Registry):
            help, choices = f"{help}: {choices.described()}", choices.names()
        default = (defaults or {}).get(f.name, f.default)
        default = ",".join(default) if isinstance(default, tuple) else default
        if default not in (None, "") and "default" not in help:
            help = f"{help} (default: {default})"
        convert = PARSERS[m["parse"]] if m.get("parse") else _BY_TYPE.get(str(f.type), str)
        p.add_argument(flag, dest=dest, type=convert, choices=choices, default=default, help=help)


def dataclass_values(args: argparse.Namespace, config_cls, skip: Iterable[str] = ()) -> dict[str, Any]:
    """{field: value} of config_cls's flags that this command's parser has (add_dataclass_args made them)."""
    return {f.name: getattr(args, dest) for f, _, dest in _flags(config_cls, skip) if hasattr(args, dest)}


def changed_flags(args: argparse.Namespace, config_cls) -> list[str]:
    """The flags of config_cls that this command line set to something other than their default."""
    def default(f):
        return ",".join(f.default) if isinstance(f.default, tuple) else f.default
    return [flag for f, flag, dest in _flags(config_cls, ()) if hasattr(args, dest) and getattr(args, dest) != default(f)]
