"""Where specserve keeps what it builds or fetches (never a copy of a model's weights)."""
from __future__ import annotations

import glob
import os
import re
import sys
from typing import Optional


def cache_dir() -> Optional[str]:
    """~/.cache/specserve (SPECSERVE_CACHE_DIR moves it; "" turns caching off): the default n-gram
    drafter's model, built once from the standard library."""
    d = os.environ.get("SPECSERVE_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "specserve"))
    return d or None


def models_dir() -> str:
    """Where `specserve pull` assembles known models: ~/.cache/specserve/models (SPECSERVE_MODELS)."""
    return os.environ.get("SPECSERVE_MODELS") or os.path.join(os.path.expanduser("~"), ".cache", "specserve", "models")


# Parsed-model caches of earlier versions (<file hash>-<blocks|dense>-v<N>.pt, up to 14 GB a model):
# nothing reads them any more.
_STALE = re.compile(r"[0-9a-f]{32}-(blocks|dense)-v\d+\.pt")


def drop_stale_caches() -> int:
    """Delete the parsed-model caches earlier versions wrote into cache_dir(), saying so once.
    Returns the bytes freed."""
    d = cache_dir()
    if not d or not os.path.isdir(d):
        return 0
    freed = 0
    for path in glob.glob(os.path.join(d, "*.pt")):
        if _STALE.fullmatch(os.path.basename(path)):
            try:
                size = os.path.getsize(path)
                os.remove(path)
                freed += size
            except OSError:
                pass
    if freed:
        print(f"specserve: removed {freed / 1e9:.2f} GB of parsed-model caches left in {d} by an earlier version "
              f"(models are read in place now)", file=sys.stderr)
    return freed
