"""argparse types that reject bad numbers with one line, and dataclass configs as flags (shared by
every subcommand)."""
from __future__ import annotations

import argparse
import dataclasses


def _checked(convert, ok, rule: str):
    """An argparse type: convert, then reject values that break `rule` with one line."""
    def parse(s: str):
        v = convert(s)
        if not ok(v):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {v}")
        return v
    return parse


positive_int = _checked(int, lambda v: v >= 1, ">= 1")
top_p = _checked(float, lambda v: 0 < v <= 1, "in (0, 1]")
temperature = _checked(float, lambda v: 0 <= v < float("inf"), "a finite number >= 0")
positive_float = _checked(float, lambda v: 0 < v < float("inf"), "a finite number > 0")


def add_dataclass_args(p: argparse.ArgumentParser, config_cls, help: dict) -> None:
    """One flag per field of a config dataclass (`max_n` -> `--max-n`), its default the field's:
    bools as --x/--no-x, ints and floats typed, anything else (str, Optional[str]) as a string."""
    for f in dataclasses.fields(config_cls):
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type)
        if kind == "bool":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help.get(f.name))
        else:
            p.add_argument(flag, type={"int": int, "float": float}.get(kind, str), default=f.default,
                           help=help.get(f.name))
