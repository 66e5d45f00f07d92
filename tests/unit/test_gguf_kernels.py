"""gguf_matmul (GGUF's own blocks read in place) against dense fp32 over the reference dequantisation,
on random blocks of every type, at the odd widths real models have (the 0.5B's 896 and 4,864)."""
import numpy as np
import pytest
import torch

from specserve import kernels
from specserve.loading.quants import BLOCK_LAYOUT, dequantize
from specserve.loading.weights import QuantizedWeight

from .test_quants import random_blocks

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no compiler / AVX2 for the block kernels")

TYPES = list(kernels.GGUF_TYPES)


@pytest.fixture(params=["avx2", "avx512"])
def build(request):
    ext = kernels.ext()
    before = ext.block_kernel_avx512()
    if not ext.block_kernel_avx512(request.param == "avx512") and request.param == "avx512":
        ext.block_kernel_avx512(before)
        pytest.skip("this CPU has no AVX-512")
    yield request.param
    ext.block_kernel_avx512(before)


def weight(type_name: str, n: int, k: int, seed: int = 0) -> QuantizedWeight:
    per_block, _ = BLOCK_LAYOUT[type_name]
    raw = random_blocks(type_name, n * k // per_block, np.random.default_rng(seed)).reshape(n, -1)
    return QuantizedWeight(type_name, raw, (n, k))


def widths(type_name: str) -> list[int]:
    return [256, 4864] if BLOCK_LAYOUT[type_name][0] == 256 else [32, 896, 4864]


def relative_error(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    """|y - x W^T| over |x| |W|^T (float64): the error relative to what fp32 rounding scales with."""
    ref = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    return ((y.double() - ref).abs() / scale.clamp_min(1e-30)).max().item()


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("M", [1, 3, 8, 9, 20])
def test_matches_dense_fp32(type_name, M, build):
    for k in widths(type_name):
        qw = weight(type_name, 37, k)
        gw = kernels.GgufWeight([qw])
        dense = torch.from_numpy(dequantize(qw.raw, type_name, qw.shape))
        x = torch.randn(M, k)
        assert relative_error(gw.matmul(x), x, dense) < 1e-5, (type_name, k)


@pytest.mark.parametrize("type_name", TYPES)
def test_dequantize_and_rows_are_the_reference_values(type_name):
    qw = weight(type_name, 11, widths(type_name)[-1])
    gw = kernels.GgufWeight([qw])
    ref = torch.from_numpy(dequantize(qw.raw, type_name, qw.shape))
    assert torch.equal(gw.dequantize(), ref)
    ids = torch.tensor([7, 0, 10, 7])
    assert torch.equal(gw.rows(ids), ref[ids])


@pytest.mark.parametrize("type_name", TYPES)
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(type_name, build):
    """Every output is summed in one fixed order: row r of an M-row pass has the bits of the one-row
    pass over it (a verify pass gives the bits of one-token steps)."""
    k = widths(type_name)[-1]
    gw = kernels.GgufWeight([weight(type_name, 40, k)])
    x = torch.randn(19, k)
    full = gw.matmul(x)
    for r in range(19):
        assert torch.equal(gw.matmul(x[r:r + 1].clone()), full[r:r + 1]), r
    assert torch.equal(gw.matmul(x[5:13].clone()), full[5:13])


@pytest.mark.parametrize("type_name", TYPES)
def test_panels_give_the_bits_of_whole_columns(type_name):
    """Passes of 16+ rows run each column a panel of 256 weights at a time (the AVX2 build's
    columns_panels), keeping the accumulators between panels: the same sums in the same order as the
    whole-column loop, so the same bits, at widths of one panel, several, and a last partial one."""
    ext = kernels.ext()
    before = ext.block_kernel_avx512()
    try:
        ext.block_kernel_avx512(False)
        for k in [512, 4864] if BLOCK_LAYOUT[type_name][0] == 256 else [288, 896, 4864]:
            gw = kernels.GgufWeight([weight(type_name, 35, k)])
            x = torch.randn(21, k)
            assert ext.gguf_kernel_panels()
            fast = gw.matmul(x)
            ext.gguf_kernel_panels(False)
            try:
                whole = gw.matmul(x)
            finally:
                ext.gguf_kernel_panels(True)
            assert torch.equal(fast, whole), (type_name, k)
    finally:
        ext.block_kernel_avx512(before)


def test_mixed_segments_stack_their_products(build):
    """q, k and v of a Q4_K_M layer differ in type (Q4_K, Q4_K, Q6_K): one call over the segments gives,
    bit for bit, each segment's own product side by side."""
    parts = [weight("Q4_K", 48, 512, 1), weight("Q6_K", 16, 512, 2), weight("Q5_0", 24, 512, 3), weight("Q8_0", 8, 512, 4)]
    x = torch.randn(5, 512)
    stacked = kernels.GgufWeight(parts).matmul(x)
    assert torch.equal(stacked, torch.cat([kernels.GgufWeight([p]).matmul(x) for p in parts], dim=1))
    assert stacked.shape == (5, 96)


def test_builds_agree_to_fp32_rounding():
    ext = kernels.ext()
    if not ext.block_kernel_avx512():
        pytest.skip("this CPU has no AVX-512")
    qw = weight("Q4_K", 64, 1536)
    gw = kernels.GgufWeight([qw])
    x = torch.randn(4, 1536)
    fast = gw.matmul(x)
    try:
        ext.block_kernel_avx512(False)
        plain = gw.matmul(x)
    finally:
        ext.block_kernel_avx512(True)
    dense = torch.from_numpy(dequantize(qw.raw, "Q4_K", qw.shape))
    scale = x.double().abs() @ dense.double().abs().T
    assert ((fast.double() - plain.double()).abs() / scale).max().item() < 1e-5
    assert not torch.equal(fast, plain)  # two summation orders: they differ in the last bits


def test_bad_inputs_are_one_line_errors():
    ext = kernels.ext()
    qw = weight("Q4_K", 4, 256)
    with pytest.raises(RuntimeError, match="is not 512 elements of GGML type 12"):
        ext.gguf_linear(torch.randn(1, 512), [torch.from_numpy(qw.raw)], [12])
    with pytest.raises(RuntimeError, match="not one the kernels take"):
        ext.gguf_linear(torch.randn(1, 256), [torch.from_numpy(qw.raw)], [13])
    with pytest.raises(RuntimeError, match="id out of range"):
        ext.gguf_dequantize_rows(torch.from_numpy(qw.raw), 12, torch.tensor([4]), 256)
