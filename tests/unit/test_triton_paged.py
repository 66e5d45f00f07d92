"""The static step's attention and fused ops against the engine's references: the torch forms
always, the Triton kernels under Triton's interpreter where triton is installed (pip install
'.[gpu-test]'; the tests below say so in one line where it is not)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from specserve.attention import triton_paged  # noqa: E402
from specserve.attention.paged import AttentionMetadata, paged_attention  # noqa: E402
from specserve.cuda import ops  # noqa: E402
from specserve.cuda.buffers import StaticInputs  # noqa: E402
from specserve.models.layers import add_rms_norm, rope, silu_mul  # noqa: E402

needs_triton = pytest.mark.skipif(not triton_paged.available(), reason="triton not installed (pip install '.[gpu-test]')")
CPU = torch.device("cpu")


def _batch(H=4, Hkv=2, D=16, bs=4, seed=0):
    """A ragged step: a decode over 37 keys, a chain of 1 + 3 over 20, a tree of 5 queries over 12
    (its 6 tree rows: one cached level, then the 5 fed now), written into a paged cache."""
    g = torch.Generator().manual_seed(seed)
    q_lens, kv_lens = [1, 4, 5], [37, 20, 12]
    trees = [None, None, [-1, 0, 0, 1, 1, 2]]
    nblk = [-(-k // bs) for k in kv_lens]
    perm = torch.randperm(sum(nblk) + 3, generator=g).tolist()  # scattered blocks
    tables, at = [], 0
    for n in nblk:
        tables.append(perm[at:at + n])
        at += n
    slots = (sum(nblk) + 3) * bs
    k_cache = torch.randn(slots, Hkv, D, generator=g)
    v_cache = torch.randn(slots, Hkv, D, generator=g)
    T = sum(q_lens)
    q = torch.randn(T, H, D, generator=g)
    k = torch.randn(T, Hkv, D, generator=g)
    v = torch.randn(T, Hkv, D, generator=g)
    return q_lens, kv_lens, tables, trees, k_cache, v_cache, q, k, v


def _reference(q_lens, kv_lens, tables, trees, k_cache, v_cache, q, k, v, bs=4):
    meta = AttentionMetadata.build(q_lens, kv_lens, tables, bs, CPU, mode="pad", span_parents=trees)
    kc, vc = k_cache.clone(), v_cache.clone()
    return paged_attention(q, k, v, kc, vc, meta, q.shape[-1] ** -0.5), kc, vc


def _static(q_lens, kv_lens, tables, trees, padded=16, bs=4):
    inp = StaticInputs(32, 4, 16, 8, bs, CPU)
    T = sum(q_lens)
    inp.fill([0] * T, list(range(T)), q_lens, kv_lens, tables, trees, padded)
    return inp


def _pad(x, n):
    return torch.cat([x, torch.randn(n - x.shape[0], *x.shape[1:])])


def test_torch_attention_over_the_buffers_matches_the_reference():
    q_lens, kv_lens, tables, trees, k_cache, v_cache, q, k, v = _batch()
    ref, kc, vc = _reference(q_lens, kv_lens, tables, trees, k_cache, v_cache, q, k, v)
    inp = _static(q_lens, kv_lens, tables, trees)
    out = triton_paged.attention_torch(_pad(q, 16), kc, vc, inp, q.shape[-1] ** -0.5)
    T = sum(q_lens)
    torch.testing.assert_close(out[:T], ref, rtol=1e-5, atol=1e-5)
    assert out[T:].abs().max() == 0  # padding rows see no key


@needs_triton
def test_triton_attention_matches_the_reference_under_the_interpreter():
    q_lens, kv_lens, tables, trees, k_cache, v_cache, q, k, v = _batch()
    ref, kc, vc = _reference(q_lens, kv_lens, tables, trees, k_cache, v_cache, q, k, v)
    inp = _static(q_lens, kv_lens, tables, trees)
    # q as the static step passes it: a strided view into the qkv product
    T, H, D = q.shape
    Hkv = k.shape[1]
    qkv = torch.randn(16, (H + 2 * Hkv) * D)
    qkv[:T, :H * D] = q.reshape(T, -1)
    qv = qkv[:, :H * D].view(16, H, D)
    out = triton_paged.attention_triton(qv, kc, vc, inp, D ** -0.5)
    torch.testing.assert_close(out[:T], ref, rtol=1e-4, atol=1e-4)
    assert out[T:].abs().max() == 0


@needs_triton
def test_triton_attention_gqa_group_of_six_and_head_dim_128():
    """Qwen2.5-1.5B's shape: 12 query heads over 2 KV heads, head dim 128."""
    q_lens, kv_lens, tables, trees, k_cache, v_cache, q, k, v = _batch(H=12, Hkv=2, D=128, seed=1)
    ref, kc, vc = _reference(q_lens, kv_lens, tables, trees, k_cache, v_cache, q, k, v)
    inp = _static(q_lens, kv_lens, tables, trees)
    out = triton_paged.attention_triton(_pad(q, 16), kc, vc, inp, 128 ** -0.5)
    torch.testing.assert_close(out[:sum(q_lens)], ref, rtol=1e-4, atol=1e-4)


def _rope_case(H=4, Hkv=2, D=16, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=g)
    positions = torch.tensor([3, 0, 7, 7, 8, 0], dtype=torch.int32)[:T]
    freqs = torch.arange(16, dtype=torch.float32)[:, None] * (1.0 / 10000 ** (torch.arange(0, D, 2).float() / D))[None]
    emb = torch.cat([freqs, freqs], -1)
    slots = torch.tensor([5, 1, 9, 2, -1, -1], dtype=torch.int32)[:T]
    return qkv, positions, emb.cos(), emb.sin(), slots


@pytest.mark.parametrize("fused", ["torch", "triton"])
def test_rope_store_rotates_q_and_caches_k_v(fused):
    if fused == "triton" and not triton_paged.available():
        pytest.skip("triton not installed (pip install '.[gpu-test]')")
    H, Hkv, D = 4, 2, 16
    qkv, positions, cos, sin, slots = _rope_case(H, Hkv, D)
    T = qkv.shape[0]
    c, s = cos[positions.long()], sin[positions.long()]
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], -1)
    q_ref = rope(q.reshape(T, H, D), c, s)
    k_ref = rope(k.reshape(T, Hkv, D), c, s)
    kc, vc = torch.zeros(12, Hkv, D), torch.zeros(12, Hkv, D)
    x = qkv.clone()
    (ops.rope_store_triton if fused == "triton" else ops.rope_store_torch)(x, positions, cos, sin, kc, vc, slots, H, Hkv, D)
    torch.testing.assert_close(x[:, :H * D].view(T, H, D), q_ref, rtol=1e-5, atol=1e-5)
    real = slots >= 0
    torch.testing.assert_close(kc[slots[real].long()], k_ref[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vc[slots[real].long()], v.reshape(T, Hkv, D)[real])
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[slots[real].long()] = False
    assert kc[untouched].abs().max() == 0 and vc[untouched].abs().max() == 0  # padding wrote nothing


@needs_triton
@pytest.mark.parametrize("with_delta", [False, True])
def test_triton_add_rms_norm_and_silu_mul(with_delta):
    g = torch.Generator().manual_seed(2)
    x, d, w = torch.randn(5, 96, generator=g), torch.randn(5, 96, generator=g), torch.randn(96, generator=g)
    ref_x, ref_h = add_rms_norm(x.clone(), d if with_delta else None, w, 1e-6)
    got_x, got_h = ops.add_rms_norm_triton(x.clone(), d if with_delta else None, w, 1e-6)
    torch.testing.assert_close(got_x, ref_x)
    torch.testing.assert_close(got_h, ref_h, rtol=1e-5, atol=1e-5)
    gu = torch.randn(5, 2 * 1500, generator=g)  # F = 1500: two programs a row, the second masked
    torch.testing.assert_close(ops.silu_mul_triton(gu), silu_mul(gu), rtol=1e-5, atol=1e-5)
