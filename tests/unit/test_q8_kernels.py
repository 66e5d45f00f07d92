"""Int8 activations (q8_matmul.cpp, issue 37) on random blocks of every GGUF type, at the widths real
models have: every build (AVX2, AVX-512 VNNI, AVX-VNNI, AMX-INT8 tiles, and the AVX-VNNI and tile builds
with VPDPBUSD and the tile unit emulated in software) gives the bits of the plain reference of the same quantisation; they stay within the
quantisation's own error bound of the dense fp32 product; a row's bits do not depend on the rows beside
it; stacked segments equal their parts."""
import os

import numpy as np
import pytest
import torch

from specserve import kernels
from specserve.loading.quants import BLOCK_LAYOUT, dequantize
from specserve.loading.weights import QuantizedWeight

from .test_gguf_kernels import weight, widths
from .test_quants import F16_FIELDS, random_blocks

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no compiler / AVX2 for the block kernels")

TYPES = list(kernels.GGUF_TYPES)


# "amx-only" runs the tiles for every row count ("amx", the default on AMX CPUs, sends passes of a few
# rows to VNNI); "amx-emulated" is the same code with the tile unit in software, so the tile build's
# unpacking, tile shapes and scaling are checked on every AVX-512 CPU, AMX or not. "avxvnni-emulated" is
# the AVX-VNNI build's code with VPDPBUSD in AVX2, checked on every CPU; "avxvnni" needs the instruction.
BUILDS = {"avx2": "", "vnni": "AVX-512 VNNI", "avxvnni": "AVX-VNNI", "avxvnni-emulated": "",
          "amx-only": "AMX-INT8 tiles", "amx-emulated": "AVX-512"}


@pytest.fixture(params=list(BUILDS))
def build(request):
    """q8_linear switched to one build for the test (the CPU's own choice restored after)."""
    ext = kernels.ext()
    before = ext.q8_kernel_build()
    if ext.q8_kernel_build(request.param) != request.param:
        ext.q8_kernel_build(before)
        pytest.skip(f"this CPU (or OS) gives no {BUILDS[request.param]}")
    yield request.param
    ext.q8_kernel_build(before)


def quantisation_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """|y - x W^T| can be at most sum_e |W[n, e]| d_e / 2 (d_e: the scale of e's block of 32, absmax / 127:
    each activation moves by at most half a step), plus fp32 rounding. [M, N]"""
    d = x.abs().view(x.shape[0], -1, 32).amax(-1) / 127  # [M, K/32]
    half_step = d.repeat_interleave(32, dim=1).double() / 2  # [M, K]
    rounding = 1e-5 * (x.double().abs() @ w.double().abs().T)
    return half_step @ w.double().abs().T + rounding


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("M", [1, 3, 8, 9, 20])
def test_each_build_gives_the_references_bits(type_name, M, build):
    for k in widths(type_name):
        iw = kernels.Int8Weight([weight(type_name, 37, k)])  # 37 columns: a padded group of 16
        x = torch.randn(M, k) * torch.rand(1, k) * 3  # blocks of unequal scale
        assert torch.equal(iw.matmul(x), iw.reference(x)), (type_name, k)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q8_0"])
def test_the_fast_quantiser_rounds_halves_to_even_as_the_plain_one(type_name, build):
    """Activations exactly halfway between two steps (absmax 127: a step of 1, values k + 0.5): the fast
    builds' vector quantiser must round them as the reference's nearbyint (to even), or their bits part."""
    k = widths(type_name)[-1]
    iw = kernels.Int8Weight([weight(type_name, 32, k, seed=7)])
    halves = torch.arange(k, dtype=torch.float32).remainder(120) - 59.5  # -59.5 .. 59.5, every one a tie
    halves[::32] = 127.0  # each block's absmax: d = 1
    x = torch.stack([halves, -halves, halves.roll(32)])
    assert torch.equal(iw.matmul(x), iw.reference(x))


@pytest.mark.parametrize("type_name", TYPES)
def test_within_the_quantisation_bound_of_dense_fp32(type_name):
    for k in widths(type_name):
        qw = weight(type_name, 21, k, seed=5)
        iw = kernels.Int8Weight([qw])
        dense = torch.from_numpy(dequantize(qw.raw, type_name, qw.shape))
        x = torch.randn(4, k)
        err = (iw.matmul(x).double() - x.double() @ dense.double().T).abs()
        assert (err <= quantisation_bound(x, dense)).all(), (type_name, k)
        assert err.max() > 0  # activations really are quantised (a bound met by fp32 would prove nothing)


def test_the_reference_is_the_stated_formula():
    """One Q4_K output by hand from the dequantised weight and the quantised activations: the weight's
    value is ws u + wm per sub-block, so y = sum_s (ws_s d_s isum_s + wm_s d_s sum q) up to fp32 order."""
    qw = weight("Q4_K", 1, 512, seed=2)
    x = torch.randn(1, 512)
    d = x.abs().view(-1, 32).amax(-1) / 127
    q = torch.round(x.view(-1, 32) / d[:, None])
    xq = (q * d[:, None]).view(1, -1).double()  # the activations as the kernel sees them
    dense = torch.from_numpy(dequantize(qw.raw, "Q4_K", qw.shape)).double()
    y = kernels.Int8Weight([qw]).reference(x).double()
    assert torch.allclose(y, xq @ dense.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("type_name", TYPES)
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(type_name, build):
    k = widths(type_name)[-1]
    iw = kernels.Int8Weight([weight(type_name, 40, k)])
    x = torch.randn(19, k)
    full = iw.matmul(x)
    for r in range(19):
        assert torch.equal(iw.matmul(x[r:r + 1].clone()), full[r:r + 1]), r
    assert torch.equal(iw.matmul(x[5:13].clone()), full[5:13])


def test_mixed_segments_stack_their_products(build):
    parts = [weight("Q4_K", 48, 512, 1), weight("Q6_K", 20, 512, 2), weight("Q5_0", 24, 512, 3), weight("Q8_0", 8, 512, 4)]
    x = torch.randn(5, 512)
    stacked = kernels.Int8Weight(parts).matmul(x)
    assert stacked.shape == (5, 100)
    assert torch.equal(stacked, torch.cat([kernels.Int8Weight([p]).matmul(x) for p in parts], dim=1))


def test_packing_keeps_the_files_bytes_per_block():
    for type_name in TYPES:
        k = widths(type_name)[-1]
        qw = weight(type_name, 32, k)
        assert kernels.Int8Weight([qw]).nbytes == qw.raw.nbytes, type_name


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())


def test_the_default_build_is_the_fastest_this_cpu_has():
    """Without a choice made, q8_linear runs AMX tiles where the CPU has AMX-INT8 (passes of a few rows
    go to VNNI) unless SPECSERVE_NO_AMX is set, else AVX-512 VNNI, else AVX-VNNI, else AVX2; builds a CPU
    lacks are refused, leaving the build as it was."""
    ext, flags = kernels.ext(), cpu_flags()
    default = ext.q8_kernel_build()  # the fixture-free tests run before any switch, or it was restored
    if {"amx_tile", "amx_int8"} <= flags and not os.environ.get("SPECSERVE_NO_AMX"):
        if default == "vnni":
            pytest.skip("the CPU lists AMX-INT8 but the OS did not give its tiles (arch_prctl)")
        expected = "amx"
    else:
        expected = "vnni" if "avx512_vnni" in flags else "avxvnni" if "avx_vnni" in flags else "avx2"
    assert default == expected
    try:
        assert (ext.q8_kernel_build("avxvnni") == "avxvnni") == ("avx_vnni" in flags)
        ext.q8_kernel_build(default)
        assert ext.q8_kernel_build("avxvnni-emulated") == "avxvnni-emulated"
        ext.q8_kernel_build(default)
        assert (ext.q8_kernel_build("amx-emulated") == "amx-emulated") == ({"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags)
        ext.q8_kernel_build(default)
        if not os.environ.get("SPECSERVE_NO_AMX"):  # (which sets only the default: amx-only may still be asked for)
            assert (ext.q8_kernel_build("amx-only") == "amx-only") == (default == "amx")
            ext.q8_kernel_build(default)
        with pytest.raises(RuntimeError, match="q8 builds"):
            ext.q8_kernel_build("avx9")
    finally:
        ext.q8_kernel_build(default)


def test_the_start_up_check_passes_every_build_this_cpu_runs(build):
    """The check the AMX build must pass before it becomes the default (random blocks of every type, two
    groups, two row tiles, bits against the reference): every correct build passes it. (A nibble put in
    the wrong tile row makes it fail: checked by hand, docs/decisions.md#amx-int8.)"""
    assert kernels.ext().q8_build_agrees(build)


def test_zero_rows_and_a_zero_input():
    iw = kernels.Int8Weight([weight("Q4_K", 16, 256)])
    assert iw.matmul(torch.zeros(0, 256)).shape == (0, 16)
    assert torch.equal(iw.matmul(torch.zeros(2, 256)), torch.zeros(2, 16))
    assert np.isfinite(iw.matmul(torch.full((1, 256), 1e30)).numpy()).all()


def test_only_file_mapped_pages_are_given_back(tmp_path):
    """Packing drops the file's pages from RSS (MADV_DONTNEED); on anonymous memory that would zero the
    weights, so only views of a file mapping qualify, and their bytes read back unchanged."""
    import mmap

    from specserve.kernels import _drop_pages, _file_backed
    data = np.random.default_rng(0).integers(0, 256, 5 * mmap.PAGESIZE, dtype=np.uint8)
    path = tmp_path / "blocks.bin"
    path.write_bytes(data.tobytes())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(mm, dtype=np.uint8, count=4 * mmap.PAGESIZE, offset=100).reshape(4, -1)
    assert _file_backed(view) and _file_backed(view[1:])
    assert not _file_backed(data) and not _file_backed(view.copy())
    _drop_pages(torch.frombuffer(mm, dtype=torch.uint8))
    assert np.array_equal(view.reshape(-1), data[100:100 + 4 * mmap.PAGESIZE])


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("fill", [0xFF, 0x00, 0x80])
def test_the_largest_sums_do_not_saturate(type_name, fill, build):
    """Blocks whose values all sit at one extreme (every byte but the fp16 scales set to `fill`) against
    activations all at +127 or all at -127: the largest sums any 16-bit lane of the AVX2 build holds
    (VPMADDUBSW's pairs, several added before widening). A build that adds one pair too many per lane
    saturates or wraps here, where random blocks never come close."""
    per_block, _ = BLOCK_LAYOUT[type_name]
    k = 2 * 256
    raw = random_blocks(type_name, 20 * k // per_block, np.random.default_rng(3))
    values = np.ones(raw.shape[1], dtype=bool)
    for off in F16_FIELDS[type_name]:
        values[off:off + 2] = False
    raw[:, values] = fill
    iw = kernels.Int8Weight([QuantizedWeight(type_name, raw.reshape(20, -1), (20, k))])
    for sign in (1.0, -1.0):
        x = torch.full((3, k), sign)
        assert torch.equal(iw.matmul(x), iw.reference(x)), (type_name, fill, sign)
