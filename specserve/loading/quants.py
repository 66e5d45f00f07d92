"""Vectorised dequantisation of GGML block formats (numpy, no per-block Python loops).

Every function takes the raw bytes of a tensor as a uint8 array of shape [..., bytes_per_row]
and returns float32 of shape [..., elements_per_row]. Block layouts follow ggml-common.h.
"""
from __future__ import annotations

import numpy as np

QK = 32    # elements per block of the legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
QK_K = 256  # elements per super-block of the k-quants (Q4_K, Q6_K)

# name -> (elements per block, bytes per block)
BLOCK_LAYOUT = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q8_0": (QK, 2 + QK),
    "Q4_0": (QK, 2 + QK // 2),
    "Q4_1": (QK, 4 + QK // 2),
    "Q5_0": (QK, 2 + 4 + QK // 2),
    "Q5_1": (QK, 4 + 4 + QK // 2),
    "Q4_K": (QK_K, 2 + 2 + 12 + QK_K // 2),
    "Q6_K": (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
}
SUPPORTED_TYPES = tuple(BLOCK_LAYOUT)


def _f16(b: np.ndarray) -> np.ndarray:
    """[n, 2] uint8 -> [n, 1] float32 (an fp16 scale stored little-endian)."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _split_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] packed nibbles -> [n, 32]: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def dequant_q8_0(blocks: np.ndarray) -> np.ndarray:
    d = _f16(blocks[:, :2])
    q = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.float32)
    return q * d


def dequant_q4_0(blocks: np.ndarray) -> np.ndarray:
    d = _f16(blocks[:, :2])
    q = _split_nibbles(blocks[:, 2:]).astype(np.float32) - 8.0
    return d * q


def dequant_q4_1(blocks: np.ndarray) -> np.ndarray:
    d, m = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    q = _split_nibbles(blocks[:, 4:]).astype(np.float32)
    return d * q + m


def _q5_values(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """[n, 4] little-endian high bits + [n, 16] nibbles -> [n, 32] 5-bit values (bit j of qh is
    element j's fifth bit)."""
    bits = np.unpackbits(np.ascontiguousarray(qh), axis=-1, bitorder="little")  # [n, 32]
    return _split_nibbles(qs) | (bits << 4)


def dequant_q5_0(blocks: np.ndarray) -> np.ndarray:
    d = _f16(blocks[:, :2])
    return d * (_q5_values(blocks[:, 2:6], blocks[:, 6:]).astype(np.float32) - 16.0)


def dequant_q5_1(blocks: np.ndarray) -> np.ndarray:
    d, m = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    return d * _q5_values(blocks[:, 4:8], blocks[:, 8:]).astype(np.float32) + m


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12 bytes of 6-bit (scale, min) pairs of the 8 sub-blocks of a Q4_K block."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)  # [n, 8] each


def dequant_q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, mn = _k_scale_min(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(n, 4, 32)  # 4 groups of 32 bytes; each group holds two sub-blocks
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(n, QK_K)


def dequant_q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    ql = blocks[:, :128].reshape(n, 2, 1, 64)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)  # [n, 16]
    d = _f16(blocks[:, 208:210])
    ql = (ql >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F  # [n, 2, 2, 64]
    ql = ql.reshape(n, 2, 4, 32)
    qh = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03  # [n, 2, 4, 32]
    q = (ql | (qh << 4)).astype(np.float32) - 32.0
    q = q.reshape(n, 16, 16)
    return ((d * scales)[:, :, None] * q).reshape(n, QK_K)


_DEQUANT = {
    "Q8_0": dequant_q8_0,
    "Q4_0": dequant_q4_0,
    "Q4_1": dequant_q4_1,
    "Q5_0": dequant_q5_0,
    "Q5_1": dequant_q5_1,
    "Q4_K": dequant_q4_k,
    "Q6_K": dequant_q6_k,
}


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """float32 [..., 32 n] -> Q4_0 blocks [..., 18 n] uint8, by llama.cpp's reference rule
    (quantize_row_q4_0_ref): per 32 values, d = (the value of largest magnitude) / -8 and
    q = min(15, floor(x / d + 8.5)), so that value lands on q = 0 exactly."""
    lead = x.shape[:-1]
    x = np.asarray(x, dtype=np.float32).reshape(-1, QK)
    at = np.abs(x).argmax(axis=-1)
    d = x[np.arange(len(x)), at] / -8.0  # [n]
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(15, np.floor(x * inv[:, None] + 8.5)).astype(np.uint8)  # [n, 32], 0..15
    out = np.empty((len(x), 2 + QK // 2), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
    out[:, 2:] = q[:, :QK // 2] | (q[:, QK // 2:] << 4)
    return out.reshape(*lead, -1)


_QUANTIZE = {"Q4_0": quantize_q4_0}
QUANTIZE_TYPES = tuple(_QUANTIZE)


def bits_per_weight(type_name: str) -> float:
    n, nbytes = BLOCK_LAYOUT[type_name]
    return 8.0 * nbytes / n


def requantize(raw: np.ndarray, type_name: str, shape: tuple[int, int], to: str) -> np.ndarray:
    """A [rows, cols] tensor's blocks re-encoded as `to` (a name in QUANTIZE_TYPES), row by row
    (bounded memory) -> [rows, bytes_per_row of `to`] uint8."""
    rows = np.asarray(raw).view(np.uint8).reshape(shape[0], -1)
    step = max(1, (1 << 22) // max(1, shape[1]))  # ~16 MB of float32 at a time
    chunks = (rows[i:i + step] for i in range(0, shape[0], step))
    return np.concatenate([_QUANTIZE[to](dequantize(c, type_name, (len(c), shape[1]))) for c in chunks], axis=0)


def dequantize(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Raw tensor bytes (any shape, uint8 or the plain dtype) -> float32 array of `shape` (numpy order)."""
    if type_name not in BLOCK_LAYOUT:
        raise ValueError(f"unsupported GGML tensor type {type_name}; supported: {', '.join(SUPPORTED_TYPES)}")
    if type_name == "F32":
        return np.asarray(raw).view(np.float32).reshape(shape)
    if type_name == "F16":
        return np.asarray(raw).view(np.float16).astype(np.float32).reshape(shape)
    if type_name == "BF16":
        return (np.asarray(raw).view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    _, block_bytes = BLOCK_LAYOUT[type_name]
    blocks = np.asarray(raw).view(np.uint8).reshape(-1, block_bytes)
    return _DEQUANT[type_name](blocks).reshape(shape)
