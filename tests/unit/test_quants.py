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


def test_q4_0_quantizer_matches_reference():
    """The draft re-encoding (--draft-quant q4_0) quantises as llama.cpp's reference rule, bit for bit:
    random rows, a zero block (scale 0) and blocks whose largest magnitude is negative or positive."""
    from specserve.loading.quants import quantize_q4_0
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 128)).astype(np.float32) * np.array([1e-3, 0.1, 1, 10, 100, 1], dtype=np.float32)[:, None]
    x[5, :32] = 0.0
    x[4, 40] = -500.0
    ours = quantize_q4_0(x)
    np.testing.assert_array_equal(ours, quants.quantize(x, GGMLQuantizationType.Q4_0))
    back = dequantize(ours, "Q4_0", x.shape)
    assert np.all(np.abs(back - x) <= np.abs(x).reshape(6, 4, 32).max(-1).repeat(32, -1) / 8 + 1e-6)


def test_requantized_weights_are_q4_0_of_the_stored_values_and_the_embedding_stays():
    from specserve.loading.quants import quantize_q4_0
    from specserve.loading.weights import QuantizedWeight, requantize_weights
    rng = np.random.default_rng(2)

    def stored(type_name, rows=8, cols=256):
        per_block, _ = BLOCK_LAYOUT[type_name]
        return QuantizedWeight(type_name, random_blocks(type_name, rows * cols // per_block, rng).reshape(rows, -1),
                               (rows, cols))

    w = {"embed": stored("Q8_0"), "lm_head": stored("Q8_0"), "layers.0.gate": stored("Q5_0"),
         "layers.0.down": stored("Q6_K"), "layers.0.up": stored("Q4_K"), "layers.0.q": stored("Q4_0"),
         "norm": torch.ones(256)}
    out = requantize_weights(w, "Q4_0")
    assert {k: v.type_name for k, v in out.items() if isinstance(v, QuantizedWeight)} == {
        "embed": "Q8_0", "lm_head": "Q4_0", "layers.0.gate": "Q4_0", "layers.0.down": "Q4_0",
        "layers.0.up": "Q4_K", "layers.0.q": "Q4_0"}  # Q4_K (4.5 bits a weight) is no wider than Q4_0
    for name in ("lm_head", "layers.0.gate", "layers.0.down"):
        np.testing.assert_array_equal(out[name].raw, quantize_q4_0(w[name].dequantize().numpy()))
    assert out["embed"] is w["embed"] and out["layers.0.q"] is w["layers.0.q"] and out["norm"] is w["norm"]
