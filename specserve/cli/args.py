"""argparse types that reject bad numbers with one line (shared by every subcommand)."""
from __future__ import annotations

import argparse


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
