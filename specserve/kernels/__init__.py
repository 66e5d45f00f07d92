"""CPU kernels compiled on first use (torch.utils.cpp_extension), with a pure-torch fallback.

`block_linear` multiplies fp32 activations by weights kept in GGML blocks: `BlockWeight` regroups
Q4_0 / Q4_1 into the layout of block_matmul.cpp (AVX2 / AVX-512 builds, and block_matmul_amx.cpp past
8 rows where the CPU has AMX tiles); `GgufWeight` reads every other GGUF block type (Q5_0, Q8_0,
Q4_K, Q6_K, ...) where it lies in the mmap'd file (gguf_matmul.cpp, AVX2 / AVX-512 builds);
elementwise.cpp, attention.cpp and decoder_layer.cpp fuse the rest of a decode step; sampling.cpp draws
sampled tokens.
If the compiler or AVX2 is missing, `available()` is False and callers use dense fp32 weights instead.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import mmap
import os
import sys
import warnings

import numpy as np
import torch

SOURCES = ("block_matmul.cpp", "block_matmul_avx512.cpp", "block_matmul_amx.cpp", "gguf_matmul.cpp",
           "gguf_matmul_avx512.cpp", "q8_matmul.cpp", "q8_matmul_avx2.cpp", "q8_matmul_avxvnni.cpp",
           "q8_matmul_avx512.cpp", "q8_matmul_amx.cpp",
           "elementwise.cpp", "attention.cpp", "sampling.cpp", "decoder_layer.cpp")
_ext = None
_tried = False


def _cpu_has_avx2() -> bool:
    try:
        return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    except Exception:
        return False


CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"]


def build_directory() -> str:
    """Where this checkout's kernels are built: keyed by the sources' contents, their directory, the
    interpreter and torch, so two checkouts (or venvs) never rebuild over each other's objects, and
    a source change gets a fresh directory. SPECSERVE_KERNEL_CACHE moves the root."""
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    # sys.prefix, not sys.executable: .venv/bin/python and .venv/bin/python3 are one interpreter
    for part in (here, sys.prefix, sys.version, torch.__version__, " ".join(CFLAGS)):
        h.update(part.encode() + b"\0")
    for f in sorted(os.listdir(here)):
        if f.endswith((".cpp", ".h")):
            with open(os.path.join(here, f), "rb") as fh:
                h.update(f.encode() + b"\0" + fh.read())
    root = os.environ.get("SPECSERVE_KERNEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "specserve", "kernels")
    return os.path.join(root, h.hexdigest()[:16])


@contextlib.contextmanager
def _build_guard(build_dir: str):
    """Hold an flock on build_dir for the build. The kernel releases it when its holder dies, so a
    torch `lock` file found while holding it was left by a killed build (torch would wait on it
    forever): remove it. While another live process builds, say so and wait."""
    os.makedirs(build_dir, exist_ok=True)
    with open(os.path.join(build_dir, "specserve.lock"), "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            who = f.read().strip() or "?"
            print(f"specserve: waiting for another process (pid {who}) to finish building the CPU kernels in {build_dir}",
                  file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        stale = os.path.join(build_dir, "lock")
        if os.path.exists(stale):
            print(f"specserve: removing a stale kernel build lock left by an interrupted build ({stale})",
                  file=sys.stderr, flush=True)
            os.remove(stale)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _load():
    global _ext, _tried
    if _tried:
        return _ext
    _tried = True
    if os.environ.get("SPECSERVE_NO_KERNELS") or not _cpu_has_avx2():
        return None
    try:
        from torch.utils.cpp_extension import load
        here = os.path.dirname(os.path.abspath(__file__))
        sources = [os.path.join(here, f) for f in SOURCES]
        build_dir = build_directory()
        with _build_guard(build_dir):
            # Compiling takes a minute or more the first time; later loads find the objects built.
            if not os.path.exists(os.path.join(build_dir, "specserve_kernels.so")):
                print("specserve: compiling the CPU kernels (first run only, about a minute)...", file=sys.stderr, flush=True)
            # The sources include their headers with quoted includes (found beside them), so no
            # include path is passed: the build command stays the same for every checkout.
            _ext = load(name="specserve_kernels", sources=sources, build_directory=build_dir, verbose=False,
                        extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"])
    except Exception as e:  # no compiler, no ninja, ...: fall back to dense weights, loudly
        warnings.warn(f"specserve: block kernels unavailable ({str(e).splitlines()[0][:200]}); "
                      "using dense fp32 weights (slower, same results)", stacklevel=2)
        _ext = None
    return _ext


def available() -> bool:
    return _load() is not None


def ext():
    """The compiled extension (call only after available() is True)."""
    return _ext


def amx_available() -> bool:
    """Whether blocked weights get a copy packed for the AMX build, which passes of more than 8 rows
    use (Intel CPUs with AMX tiles, unless SPECSERVE_NO_AMX is set; decided per weight when it is built)."""
    return available() and not os.environ.get("SPECSERVE_NO_AMX") and _ext.block_kernel_amx()


class BlockWeight:
    """A [N, K] weight in GGML blocks of 32, laid out for the kernel:
    qs [N, K/2] uint8 (Q4) or [N, K] int8 (Q8), scales and mins [N, K/32] float32."""

    SUPPORTED = ("Q4_0", "Q4_1", "Q8_0")

    def __init__(self, type_name: str, raw: np.ndarray, shape: tuple[int, int]):
        n, k = shape
        nb = k // 32
        blocks = np.ascontiguousarray(raw).reshape(n, nb, -1)
        f16 = lambda b: torch.from_numpy(np.ascontiguousarray(b).view(np.float16).astype(np.float32)).reshape(n, nb)
        self.shape = shape
        self.is_q4 = type_name != "Q8_0"
        if type_name == "Q8_0":
            self.scales = f16(blocks[:, :, :2])
            self.mins = torch.empty(0)
            self.qs = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 2:]).reshape(n, k))
        elif type_name == "Q4_1":
            self.scales, self.mins = f16(blocks[:, :, :2]), f16(blocks[:, :, 2:4])
            self.qs = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 4:]).reshape(n, k // 2))
        elif type_name == "Q4_0":
            # d * (q - 8) = d * q + (-8 d): a Q4_1 block whose min is -8 d (exact in fp32).
            self.scales = f16(blocks[:, :, :2])
            self.mins = -8.0 * self.scales
            self.qs = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 2:]).reshape(n, k // 2))
        else:
            raise ValueError(f"block kernels support {self.SUPPORTED}, not {type_name}")
        self.packed = self._pack_for_amx()

    def _pack_for_amx(self) -> list[torch.Tensor] | None:
        """[packed, scales, mins] regrouped for the AMX build (a copy: passes of a few rows still run on
        the AVX builds), or None (no AMX, or the AMX tile's 16 columns do not divide N: such a weight
        runs on the AVX builds only)."""
        if self.shape[0] % 16 or not amx_available():
            return None
        return _ext.block_pack_amx(self.qs, self.scales, self.mins, self.is_q4)

    def select_rows(self, ids: torch.Tensor) -> "BlockWeight":
        """A BlockWeight of some rows only (a reduced-vocabulary head cut from a full one)."""
        sub = object.__new__(BlockWeight)
        sub.shape, sub.is_q4 = (len(ids), self.shape[1]), self.is_q4
        sub.qs, sub.scales = self.qs[ids].contiguous(), self.scales[ids].contiguous()
        sub.mins = self.mins[ids].contiguous() if self.is_q4 else self.mins
        sub.packed = sub._pack_for_amx()
        return sub

    def parts(self) -> list[torch.Tensor]:
        """[qs, scales, mins] (+ the AMX-packed three where there are) as block_linear and the fused
        decoder layer take them."""
        return [self.qs, self.scales, self.mins] + (self.packed or [])

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] float32 -> [M, N] float32 (on AMX past a few rows, where the weight is packed)."""
        return _ext.block_linear(x.contiguous(), self.parts())

    def dequantize(self) -> torch.Tensor:
        """The dense [N, K] float32 weight (bit-identical to the GGUF dequantisation)."""
        return self._dense(self.qs, self.scales, self.mins)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantised rows [len(ids), K] (the embedding lookup of a tied table)."""
        return self._dense(self.qs[ids], self.scales[ids], self.mins[ids] if self.is_q4 else self.mins)

    def _dense(self, qs: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
        k = self.shape[1]
        s = scales.unsqueeze(-1)  # [rows, K/32, 1]
        if self.is_q4:
            b = qs.view(-1, k // 32, 16)
            q = torch.cat([b & 0x0F, b >> 4], dim=-1).to(torch.float32)
            return torch.addcmul(mins.unsqueeze(-1), q, s).view(-1, k)
        return (qs.view(torch.int8).view(-1, k // 32, 32).to(torch.float32) * s).view(-1, k)

    @property
    def nbytes(self) -> int:
        """Bytes one pass reads (either layout: the AMX copy is the same size)."""
        return self.qs.numel() + 4 * (self.scales.numel() + self.mins.numel())


class _GgufSegments:
    """A [N, K] weight in GGUF's own blocks: the rows of one or more QuantizedWeights (q, k and v of a
    layer, each in its own type) stacked, their raw bytes views of the mmap'd model file (never
    written). What the in-place build (GgufWeight) and the int8 one (Int8Weight) share."""

    def __init__(self, weights: list):
        from ..loading.gguf_file import GGML_TYPE_IDS
        k = weights[0].shape[1]
        assert all(w.shape[1] == k for w in weights), "stacked weights share their input width"
        self.shape = (sum(w.shape[0] for w in weights), k)
        self.type_names = [w.type_name for w in weights]
        with warnings.catch_warnings():  # read-only views of the file: the kernels never write them
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            self.raws = [torch.from_numpy(w.raw) for w in weights]  # [N_i, bytes per row] u8 each
        self.type_ids = [GGML_TYPE_IDS[t] for t in self.type_names]

    @staticmethod
    def supports(type_name: str) -> bool:
        return type_name in GGUF_TYPES

    def dequantize(self) -> torch.Tensor:
        """The dense [N, K] float32 weight (bit-identical to the GGUF dequantisation)."""
        return torch.cat([_ext.gguf_dequantize_rows(r, t, torch.arange(r.shape[0]), self.shape[1])
                          for r, t in zip(self.raws, self.type_ids)])

    def select_rows(self, ids: torch.Tensor):
        """The same kind of weight over some rows only (a reduced-vocabulary head cut from a one-segment
        head: a copy of those rows' blocks)."""
        from ..loading.weights import QuantizedWeight
        assert len(self.raws) == 1, "row selection is for a single head"
        raw = self.raws[0][ids.to(torch.int64)].numpy()
        return type(self)([QuantizedWeight(self.type_names[0], raw, (len(ids), self.shape[1]))])


class GgufWeight(_GgufSegments):
    """Read in place by gguf_matmul.cpp: nothing is copied or regrouped, so the model costs its file's
    bytes."""

    def __init__(self, weights: list):
        super().__init__(weights)
        self.types = torch.tensor(self.type_ids, dtype=torch.int64)  # as the fused layer's parts carry them
        self.packed = None  # no AMX copy: every pass runs on the AVX builds (so no row limit either)

    def parts(self) -> list[torch.Tensor]:
        """[raw_0 .. raw_k-1, types] as block_linear and the fused decoder layer take them."""
        return self.raws + [self.types]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] float32 -> [M, N] float32, every row summed in one fixed order whatever M."""
        return _ext.gguf_linear(x.contiguous(), self.raws, self.type_ids)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantised rows [len(ids), K] of a one-segment weight (an embedding lookup)."""
        assert len(self.raws) == 1, "row lookups are for a single table"
        return _ext.gguf_dequantize_rows(self.raws[0], self.type_ids[0], ids.to(torch.int64), self.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes one pass reads."""
        return sum(r.numel() for r in self.raws)


def _file_backed(a: np.ndarray) -> bool:
    """Whether a is a view of an mmap'd file (loading/gguf_file.py maps the model read-only)."""
    while a is not None and not isinstance(a, mmap.mmap):
        a = a.obj if isinstance(a, memoryview) else getattr(a, "base", None)  # np.frombuffer's base: a memoryview
    return isinstance(a, mmap.mmap)


def _drop_pages(t: torch.Tensor) -> None:
    """Let the kernel take back the whole pages under t, a view of a read-only file mapping (only
    those: on anonymous memory MADV_DONTNEED would zero them): they leave this process's RSS, and a
    later read faults them in again from the page cache. Without it a packed model would count its
    file twice."""
    page = mmap.PAGESIZE
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    first, last = -(-start // page) * page, end // page * page
    if last > first:
        _libc().madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), 4)  # MADV_DONTNEED


@functools.lru_cache(maxsize=1)
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


class Int8Weight(_GgufSegments):
    """For the int8-activation mode (q8_matmul.cpp): each segment regrouped once by q8_pack into groups
    of 16 output columns, the same bytes per block as the file, run by the AVX-512 VNNI build or the
    AVX2 one. The file's blocks stay beside it (views of the mmap, untouched), for the plain reference."""

    def __init__(self, weights: list):
        super().__init__(weights)
        k = self.shape[1]
        self.meta = torch.tensor([[t, w.shape[0]] for t, w in zip(self.type_ids, weights)], dtype=torch.int32)
        self.packed = [_ext.q8_pack(r, t, k) for r, t in zip(self.raws, self.type_ids)]
        if _ext.q8_kernel_build() != "reference":  # the file's pages were read once, to pack: give them back
            for w, r in zip(weights, self.raws):
                if _file_backed(w.raw):
                    _drop_pages(r)

    def parts(self) -> list[torch.Tensor]:
        """[packed_0 .. packed_k-1, raw_0 .. raw_k-1, meta] as block_linear and the fused decoder layer take them."""
        return self.packed + self.raws + [self.meta]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] float32 -> [M, N] float32, x quantised to 8 bits per 32 values; every row summed in
        one fixed order whatever M."""
        return _ext.q8_linear(x.contiguous(), self.parts())

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same product by the plain formula over the file's blocks (the bits matmul must give)."""
        return _ext.q8_reference(x.contiguous(), self.raws, self.type_ids)

    @property
    def nbytes(self) -> int:
        """Bytes one pass reads (the packed copy: the file's bytes, padded to 16 columns)."""
        return sum(p.numel() for p in self.packed)


# The GGUF block types gguf_matmul.cpp reads in place.
GGUF_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K")
