"""cuda/linear.py under Triton's interpreter (where triton is installed): the batch-invariant projection
is torch's linear up to float rounding, and its tiling does not follow the pass's row count."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from specserve.cuda import linear  # noqa: E402

pytestmark = pytest.mark.skipif(not linear.available(), reason="triton not installed (pip install '.[gpu-test]')")


@pytest.mark.parametrize("bias", [False, True])
def test_linear_is_torchs(bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 100, generator=g)  # K and N past whole tiles, M over three
    w = torch.randn(70, 100, generator=g)
    b = torch.randn(70, generator=g) if bias else None
    torch.testing.assert_close(linear.linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(linear.linear(x[:, :64], w[:, :64]), F.linear(x[:, :64], w[:, :64]),
                               rtol=1e-5, atol=1e-5)  # rows strided: a view into a wider tensor


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tiling_does_not_depend_on_the_row_count(dtype):
    """Each row of a pass over m rows is the same bits as in a pass over more: no tile, split or order
    follows M. (That a row's bits also do not depend on its place in a tile holds for the GPU's matrix
    instructions, not for the interpreter's numpy products: bench/gpu/invariance.py checks it there.)"""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(40, 96, generator=g) * 3).to(dtype)
    w = torch.randn(50, 96, generator=g).to(dtype)
    full = linear.linear(x, w)
    for m in (1, 2, 5, 16, 17, 33):
        assert torch.equal(linear.linear(x[:m], w), full[:m]), m
