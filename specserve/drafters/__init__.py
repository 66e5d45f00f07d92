"""Drafters: one interface (base.py), one file per method, each named once in
`specserve.registry.DRAFTERS`. `build_drafter` looks the method up there; the engine never branches
on the method."""
from __future__ import annotations

from ..registry import DRAFTERS
from .base import Draft, Drafter, DrafterContext, Proposal, TreeShape


def build_drafter(spec, ctx: DrafterContext) -> Drafter:
    """spec: config.SpeculativeConfig; ctx: the target and its files."""
    return DRAFTERS.get(spec.method)(spec, ctx)


__all__ = ["Draft", "Drafter", "DrafterContext", "Proposal", "TreeShape", "build_drafter"]
