"""Both attention paths (the C++ paged kernel and padded SDPA) against a naive per-sequence reference
on a ragged batch whose blocks are scattered through the cache."""
import pytest
import torch

from specserve import kernels
from specserve.attention import paged
from specserve.attention.paged import AttentionMetadata, paged_attention

H, HKV, D, BS = 6, 2, 16, 4
Q_LENS, KV_LENS = [1, 3, 1, 5], [7, 20, 33, 12]


def reference(q, k_cache, v_cache, tables):
    out, t = [], 0
    for ql, kl, table in zip(Q_LENS, KV_LENS, tables):
        slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(kl)])
        keys = k_cache[slots].repeat_interleave(H // HKV, dim=1)  # [kl, H, D]
        vals = v_cache[slots].repeat_interleave(H // HKV, dim=1)
        for i in range(ql):
            pos = kl - ql + i
            s = torch.einsum("hd,khd->hk", q[t], keys[:pos + 1]) / D ** 0.5
            out.append(torch.einsum("hk,khd->hd", s.softmax(-1), vals[:pos + 1]))
            t += 1
    return torch.stack(out)


@pytest.mark.parametrize("path", ["kernel", "sdpa", "mixed"])
def test_ragged_paged_attention_matches_reference(path, monkeypatch):
    """mixed: spans of 1 take the short path, spans of 3 and 5 are padded among themselves only."""
    if path in ("kernel", "mixed") and not kernels.available():
        pytest.skip("no block kernels")
    if path == "sdpa":
        monkeypatch.setattr(paged, "PAGED_KERNEL_MAX_Q", 0)
    if path == "mixed":
        monkeypatch.setattr(paged, "PAGED_KERNEL_MAX_Q", 2)
    g = torch.Generator().manual_seed(0)
    num_blocks = 40
    order = torch.randperm(num_blocks, generator=g).tolist()  # scattered, non-contiguous blocks
    tables, used = [], 0
    for kl in KV_LENS:
        n = -(-kl // BS)
        tables.append(order[used:used + n])
        used += n
    k_cache = torch.randn(num_blocks * BS, HKV, D, generator=g)
    v_cache = torch.randn(num_blocks * BS, HKV, D, generator=g)
    T = sum(Q_LENS)
    q = torch.randn(T, H, D, generator=g)
    k_new, v_new = torch.randn(T, HKV, D, generator=g), torch.randn(T, HKV, D, generator=g)
    meta = AttentionMetadata.build(Q_LENS, KV_LENS, tables, BS, torch.device("cpu"))
    assert (meta.span_groups() is not None) == (path == "mixed")
    ours = paged_attention(q, k_new, v_new, k_cache, v_cache, meta, D ** -0.5)
    if path == "mixed":  # a decode row gets exactly what it gets in a batch of decode rows only
        short = [0, 2]
        rows = torch.tensor([0, 4])  # their token rows in the flat batch
        alone = AttentionMetadata.build([Q_LENS[i] for i in short], [KV_LENS[i] for i in short], [tables[i] for i in short],
                                        BS, torch.device("cpu"))
        assert torch.equal(paged_attention(q[rows], k_new[rows], v_new[rows], k_cache, v_cache, alone, D ** -0.5), ours[rows])
    # the new tokens' K/V were written into their slots first
    torch.testing.assert_close(k_cache[meta.slot_mapping], k_new)
    torch.testing.assert_close(ours, reference(q, k_cache, v_cache, tables), rtol=1e-5, atol=1e-5)
