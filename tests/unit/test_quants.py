"""Our vectorised dequantisers against the gguf package's reference, on random blocks."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from specserve.loading.quants import BLOCK_LAYOUT, dequantize

# byte ranges of each block holding an fp16 scale: made finite so both sides compute numbers
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q6_K": [208]}


def random_blocks(type_name, n_blocks, rng):
    _, nbytes = BLOCK_LAYOUT[type_name]
    raw = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[type_name]:
        raw[:, off:off + 2] = rng.uniform(-0.1, 0.1, size=n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K"])
def test_block_formats_match_reference(type_name):
    rng = np.random.default_rng(0)
    per_block, _ = BLOCK_LAYOUT[type_name]
    raw = random_blocks(type_name, 64, rng)
    rows, cols = 4, 64 * per_block // 4
    ours = dequantize(raw.reshape(rows, -1), type_name, (rows, cols))
    ref = quants.dequantize(raw.reshape(rows, -1), GGMLQuantizationType[type_name])
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("type_name,dtype", [("F32", np.float32), ("F16", np.float16)])
def test_plain_formats(type_name, dtype):
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(dtype)
    np.testing.assert_array_equal(dequantize(x, type_name, (3, 8)), x.astype(np.float32))


def test_bf16():
    x = torch.randn(3, 8).to(torch.bfloat16)
    raw = x.view(torch.int16).numpy()
    np.testing.assert_array_equal(dequantize(raw, "BF16", (3, 8)), x.float().numpy())


def test_unsupported_type_names_what_is_supported():
    with pytest.raises(ValueError, match="supported: F32"):
        dequantize(np.zeros(4, np.uint8), "Q5_K", (1, 256))
