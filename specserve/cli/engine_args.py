"""The engine's flags, generated from its config dataclasses (config.py), and LLM(...)'s keywords read
back from them: every command that builds an LLM (generate, serve, the benches) takes the same flags
and gets the same keywords."""
from __future__ import annotations

import argparse
from typing import Any, Optional

from ..config import CacheConfig, GuidedConfig, LoadConfig, ModelConfig, SchedulerConfig, SpeculativeConfig
from ..registry import DRAFTERS, GUIDED
from .args import add_dataclass_args, changed_flags, dataclass_values

# Flagged fields of these map to LLM(...)'s keywords of the same names.
_ENGINE = (ModelConfig, CacheConfig, SchedulerConfig, LoadConfig)
# The batch size is a server's setting: generate and the benches choose their own.
_SERVER_ONLY = ("max_num_seqs",)
NO_SPECULATION = "none"  # --speculative's choice for regular decoding


def add_model_args(p: argparse.ArgumentParser, batch: bool = False) -> None:
    """The model, cache, scheduler and load flags; batch: --max-num-seqs too."""
    for cls in _ENGINE:
        add_dataclass_args(p, cls, skip=() if batch else _SERVER_ONLY)


def add_spec_args(p: argparse.ArgumentParser, default: str = NO_SPECULATION) -> None:
    """--speculative METHOD (SpeculativeConfig.method, or none) and a flag per other SpeculativeConfig field."""
    p.add_argument("--speculative", choices=DRAFTERS.names() + (NO_SPECULATION,), default=default,
                   help=f"speculative decoding: {DRAFTERS.described()}; or {NO_SPECULATION}")
    add_dataclass_args(p, SpeculativeConfig)


def spec_from_args(args: argparse.Namespace) -> Optional[dict[str, Any]]:
    """LLM(speculative=...) from add_spec_args's flags: None for --speculative none, where a speculative
    flag given anyway is an error, not silently ignored (`--draft-model X` alone decodes plainly)."""
    if args.speculative == NO_SPECULATION:
        given = changed_flags(args, SpeculativeConfig)
        if given:
            raise ValueError(f"{', '.join(given)} set without a speculative method: add --speculative METHOD "
                             f"({', '.join(DRAFTERS.names())})")
        return None
    return {"method": args.speculative, **dataclass_values(args, SpeculativeConfig)}


def _guided_flags():
    """(kind, flag, its dest, what it takes) per registry.GUIDED kind."""
    for kind in GUIDED.names():
        flag, value = GUIDED.meta(kind)["flag"], GUIDED.meta(kind)["value"]
        yield kind, flag, flag[2:].replace("-", "_"), value


def add_guided_args(p: argparse.ArgumentParser) -> None:
    """A flag per guided kind, at most one on a command line; --no-fast-forward (GuidedConfig)."""
    group = p.add_mutually_exclusive_group()
    for kind, flag, _, value in _guided_flags():
        if value == "none":
            group.add_argument(flag, action="store_true", help=GUIDED.help(kind))
        else:
            group.add_argument(flag, metavar="FILE" if value == "file" else None, default=None, help=GUIDED.help(kind))
    add_dataclass_args(p, GuidedConfig)


def guided_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """SamplingParams' guided_KIND field from add_guided_args's flags ({} for none)."""
    for kind, _, dest, value in _guided_flags():
        given = getattr(args, dest)
        if given:
            return {f"guided_{kind}": _GUIDED_VALUE[value](given)}
    return {}


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None


# What a guided kind's flag takes -> the SamplingParams value.
_GUIDED_VALUE = {"file": _read, "text": lambda s: s, "none": lambda on: True,
                 "list": lambda s: [c.strip() for c in s.split(",") if c.strip()]}


def llm_kwargs(args: argparse.Namespace, **overrides: Any) -> dict[str, Any]:
    """LLM(...)'s keywords from the flags this command's parser has (add_model_args, add_guided_args's
    --no-fast-forward), then `overrides`: speculative=spec_from_args(args) where the command has
    add_spec_args's flags, a bench's fixed settings."""
    kw: dict[str, Any] = {}
    for cls in _ENGINE:
        kw.update(dataclass_values(args, cls))
    # LLM(...) names GuidedConfig's fields guided_*
    kw.update({f"guided_{k}": v for k, v in dataclass_values(args, GuidedConfig).items()})
    return {**kw, **overrides}
