"""The GGML block kernels give the same products as dense fp32 over the dequantised weight."""
import numpy as np
import pytest
import torch

from specserve import kernels
from specserve.loading.quants import dequantize

from .test_quants import random_blocks

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no compiler / AVX2 for the block kernels")

# The kernel has AVX2, AVX-512 and AMX builds (chosen at run time; AMX per weight, by packing it at
# load time); test every one this CPU runs.
BUILDS = ["avx2", "avx512", "amx"]


@pytest.fixture(params=BUILDS)
def build(request, monkeypatch):
    ext = kernels.ext()
    before = ext.block_kernel_avx512()
    if request.param == "amx":
        if not kernels.amx_available():
            pytest.skip("this CPU (or OS) gives no AMX tiles")
    else:
        monkeypatch.setenv("SPECSERVE_NO_AMX", "1")  # weights built in the test stay unpacked
        if request.param == "avx512" and not ext.block_kernel_avx512(True):
            ext.block_kernel_avx512(before)
            pytest.skip("this CPU has no AVX-512")
        if request.param == "avx2":
            ext.block_kernel_avx512(False)
    yield request.param
    ext.block_kernel_avx512(before)


def block_weight(type_name: str, raw, shape, build: str):
    """The weight, and its product on the build under test (block_linear picks AMX only past 8 rows,
    so the AMX build is called directly, for every row count)."""
    bw = kernels.BlockWeight(type_name, raw, shape)
    assert (bw.packed is not None) == (build == "amx")
    if build == "amx":
        return bw, lambda x: kernels.ext().block_matmul_amx(x.contiguous(), *bw.packed, bw.is_q4)
    return bw, bw.matmul


def test_block_linear_uses_amx_past_8_rows():
    if not kernels.amx_available():
        pytest.skip("this CPU (or OS) gives no AMX tiles")
    rng = np.random.default_rng(1)
    N, K = 64, 128
    bw = kernels.BlockWeight("Q4_1", random_blocks("Q4_1", N * K // 32, rng).reshape(N, -1), (N, K))
    ext = kernels.ext()
    for M in (1, 8, 9, 24):
        x = torch.randn(M, K)
        avx, amx = ext.block_matmul(x, bw.qs, bw.scales, bw.mins, True), ext.block_matmul_amx(x, *bw.packed, True)
        torch.testing.assert_close(amx, avx, rtol=1e-5, atol=1e-5)  # both fp32-accurate ...
        assert not torch.equal(amx, avx)  # ... rounded differently
        assert torch.equal(bw.matmul(x), avx if M <= 8 else amx), M


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("M", [1, 3, 8, 11, 19, 150])  # AMX: 150 rows are two slices of rows
def test_block_matmul_matches_dense(type_name, M, build):
    rng = np.random.default_rng(M)
    N, K = (48 if build == "amx" else 40), 96  # AMX packs groups of 16 columns
    raw = random_blocks(type_name, N * K // 32, rng).reshape(N, -1)
    dense = torch.from_numpy(dequantize(raw, type_name, (N, K)).copy())
    bw, product = block_weight(type_name, raw, (N, K), build)
    # seeded: an unseeded x followed the RNG state other tests left (a near-cancelling sum once missed atol)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M))
    ref = x.double() @ dense.double().T
    torch.testing.assert_close(product(x).double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bw.dequantize(), dense, rtol=0, atol=0)
    ids = torch.tensor([0, 7, 39])
    torch.testing.assert_close(bw.rows(ids), dense[ids], rtol=0, atol=0)


def test_fused_elementwise_ops_match_the_references():
    """The C++ fast paths of add_rms_norm, silu_mul and rope_qkv against the one torch reference each."""
    from specserve.models.layers import Rotary, add_rms_norm, rms_norm_ref, rope, rope_qkv
    ext = kernels.ext()
    x, r, w = torch.randn(5, 64), torch.randn(5, 64), torch.randn(64)
    x2, out = add_rms_norm(x.clone(), r, w, 1e-5)  # the kernel: x2 updated in place
    ref_x = x + r
    torch.testing.assert_close(x2, ref_x)
    torch.testing.assert_close(out, rms_norm_ref(ref_x, w, 1e-5), rtol=1e-5, atol=1e-5)
    with torch.enable_grad():  # autograd (training) takes the reference: same numbers
        xg = x.clone().requires_grad_()
        xr, outg = add_rms_norm(xg, r, w, 1e-5)
        outg.sum().backward()
        assert xg.grad is not None
    torch.testing.assert_close(outg.detach(), out, rtol=1e-5, atol=1e-5)
    gu = torch.randn(4, 32)
    torch.testing.assert_close(ext.silu_mul(gu), torch.nn.functional.silu(gu[:, :16]) * gu[:, 16:], rtol=1e-5, atol=1e-6)
    rot = Rotary(16, 10000.0, None, 64, None, torch.device("cpu"))
    pos = torch.tensor([0, 3, 9])
    cos, sin = rot.tables(pos)
    qkv = torch.randn(3, (2 + 2 * 1) * 16)
    half = 8
    q = qkv[:, :32].view(3, 2, 16)
    ref_q = q * cos[:, None] + torch.cat([-q[..., half:], q[..., :half]], -1) * sin[:, None]
    torch.testing.assert_close(rope(q, cos, sin), ref_q, rtol=1e-6, atol=1e-6)
    fused_q, fused_k, v = rope_qkv(qkv.clone(), cos, sin, 2, 1, 16)
    torch.testing.assert_close(fused_q, ref_q, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused_k, rope(qkv[:, 32:48].view(3, 1, 16), cos, sin), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v.reshape(3, 16), qkv[:, 48:])


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
def test_block_matmul_row_results_do_not_depend_on_the_other_rows(type_name, build):
    """Each output is summed in one fixed order whatever the tile: a row gives the same bits alone, in
    a verify span or in a batch, so speculative greedy decoding matches regular greedy exactly."""
    rng = np.random.default_rng(0)
    # AVX builds: N not a multiple of any tile width, so remainder columns too; AMX: 3 groups of 16
    N, K = (48 if build == "amx" else 37), 160
    raw = random_blocks(type_name, N * K // 32, rng).reshape(N, -1)
    _, product = block_weight(type_name, raw, (N, K), build)
    x = torch.randn(150, K)
    full = product(x)
    for rows in (1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 33, 130):  # AMX: tiles of 16 rows, slices of 128
        parts = torch.cat([product(x[i:i + rows].contiguous()) for i in range(0, 150, rows)])
        assert torch.equal(parts, full), rows
