"""Where specserve keeps what it builds or fetches (never a copy of a model's weights)."""
from __future__ import annotations

import os
from typing import Optional


def cache_dir() -> Optional[str]:
    """~/.cache/specserve (SPECSERVE_CACHE_DIR moves it; "" turns caching off): the default n-gram
    drafter's model, built once from the standard library."""
    d = os.environ.get("SPECSERVE_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "specserve"))
    return d or None


def models_dir() -> str:
    """Where `specserve pull` assembles known models: ~/.cache/specserve/models (SPECSERVE_MODELS)."""
    return os.environ.get("SPECSERVE_MODELS") or os.path.join(os.path.expanduser("~"), ".cache", "specserve", "models")
