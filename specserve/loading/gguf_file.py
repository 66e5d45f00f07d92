"""A GGUF file's header read directly, and its tensors as views of the mmap'd file (no copy).

The `gguf` package's reader builds a numpy view per array element, which takes ~6 s on a 151k-token
vocabulary; reading the same header with struct takes a fraction of a second, so no parsed copy of
the model is cached anywhere. Every inconsistency (truncation, a tensor past the end, an unknown
type, a shape that does not match its bytes) is one ValueError naming the file and what is wrong.

Layout (GGUF v2/v3, little-endian): "GGUF", version u32, tensor count u64, key-value count u64;
the key-values (key string, value type u32, value); the tensor infos (name string, n_dims u32,
dims u64 x n_dims with the fastest dimension first, GGML type u32, offset u64 from the data start);
then the data, aligned to `general.alignment` (32 by default).
"""
from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass

import numpy as np

from .quants import BLOCK_LAYOUT

# GGML type id -> name (the types this loader knows; loading/quants.py decodes them)
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K", 14: "Q6_K",
              30: "BF16"}
GGML_TYPE_IDS = {v: k for k, v in GGML_TYPES.items()}
# Names of the types llama.cpp knows that this loader does not decode (for the error message).
_OTHER_TYPES = {9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 13: "Q5_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS",
                18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 29: "IQ1_M",
                34: "TQ1_0", 35: "TQ2_0"}

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
          10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


@dataclass
class TensorInfo:
    name: str
    type_name: str
    shape: tuple[int, ...]  # numpy order: slowest dimension first ([rows, cols] for a matrix)
    offset: int  # absolute, in the file
    nbytes: int


class _Reader:
    def __init__(self, buf, path: str):
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def fail(self, what: str):
        raise ValueError(f"{self.path}: {what}")

    def take(self, n: int) -> int:
        if n < 0 or self.pos + n > self.size:
            self.fail(f"truncated GGUF header (needs {self.pos + n} bytes, the file has {self.size})")
        p = self.pos
        self.pos += n
        return p

    def scalar(self, vtype: int):
        fmt = _SCALARS[vtype]
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar(10)
        p = self.take(n)
        return bytes(self.buf[p:p + n]).decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(vtype)
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.scalar(4), self.scalar(10)
            if etype in _NUMPY:
                dt = np.dtype(_NUMPY[etype]).newbyteorder("<")
                p = self.take(count * dt.itemsize)
                return np.frombuffer(self.buf, dtype=dt, count=count, offset=p).tolist()
            if etype == _STRING:
                out = []
                for _ in range(count):
                    out.append(self.string())
                return out
            return [self.value(etype) for _ in range(count)]
        self.fail(f"unknown GGUF value type {vtype} at byte {self.pos}")


class GGUFFile:
    """The header of a GGUF file (fields, tensor infos) and zero-copy views of its tensors."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:  # ValueError: an empty file cannot be mapped
            raise ValueError(f"{path}: cannot map the file ({e})") from None
        r = _Reader(self._mm, path)
        if r.size < 24 or bytes(self._mm[:4]) != b"GGUF":
            r.fail("not a GGUF file (no GGUF magic at the start)")
        r.pos = 4
        version = r.scalar(4)
        if version not in (2, 3):
            r.fail(f"GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_kv = r.scalar(10), r.scalar(10)
        if n_tensors > 1 << 20 or n_kv > 1 << 20:
            r.fail(f"implausible GGUF header ({n_tensors} tensors, {n_kv} fields): a corrupted file")
        self.fields: dict = {}
        for _ in range(n_kv):
            key = r.string()
            self.fields[key] = r.value(r.scalar(4))
        infos = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.scalar(4)
            if n_dims > 4:
                r.fail(f"tensor {name} has {n_dims} dimensions (at most 4)")
            dims = [r.scalar(10) for _ in range(n_dims)]
            type_id, offset = r.scalar(4), r.scalar(10)
            infos.append((name, dims, type_id, offset))
        align = self.fields.get("general.alignment", 32)
        if isinstance(align, bool) or not isinstance(align, int) or not 1 <= align <= 1 << 30:
            r.fail(f"general.alignment is {align!r}, not a whole number of bytes in [1, 2^30]: a corrupted header")
        data_start = (r.pos + align - 1) // align * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, dims, type_id, offset in infos:
            if type_id not in GGML_TYPES:
                known = _OTHER_TYPES.get(type_id, f"type id {type_id}")
                r.fail(f"tensor {name} has quantization type {known}, not supported "
                       f"(supported: {', '.join(GGML_TYPES.values())})")
            type_name = GGML_TYPES[type_id]
            elems, block_bytes = BLOCK_LAYOUT[type_name]
            shape = tuple(int(d) for d in reversed(dims))
            if dims and dims[0] % elems:
                r.fail(f"tensor {name}: a row of {dims[0]} elements is not a whole number of {type_name} blocks")
            nbytes = math.prod(shape) // elems * block_bytes  # Python ints: corrupted dims must not wrap
            start = data_start + offset
            if start + nbytes > r.size:
                r.fail(f"truncated: tensor {name} needs bytes up to {start + nbytes}, the file has {r.size}")
            self.tensors[name] = TensorInfo(name, type_name, shape, start, nbytes)

    def raw(self, name: str) -> np.ndarray:
        """Tensor `name`'s bytes as a read-only uint8 view of the file: [rows, bytes per row] for a
        matrix, flat otherwise."""
        t = self.tensors[name]
        a = np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        return a.reshape(t.shape[0], -1) if len(t.shape) == 2 else a
