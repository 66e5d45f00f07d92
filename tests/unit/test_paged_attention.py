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


@pytest.mark.parametrize("mode", ["split", "pad"])
def test_tree_spans_attend_to_their_ancestors_only(mode):
    """Sequence 1's span is a tree (root, then nodes with parents), sequence 0 a causal chain. Every
    tree row must get what the same row gets as the last row of a causal chain made of its path."""
    g = torch.Generator().manual_seed(1)
    parents = [-1, 0, 0, 1, 1, 2, 4]  # span rows: root; 1, 2 under it; 3, 4 under 1; 5 under 2; 6 under 4
    q_lens, kv_lens = [3, len(parents)], [9, 10 + len(parents)]
    num_blocks = 16
    tables = [[3, 7, 1], [5, 0, 9, 12, 2]]
    k_cache = torch.randn(num_blocks * BS, HKV, D, generator=g)
    v_cache = torch.randn(num_blocks * BS, HKV, D, generator=g)
    T = sum(q_lens)
    q = torch.randn(T, H, D, generator=g)
    k_new, v_new = torch.randn(T, HKV, D, generator=g), torch.randn(T, HKV, D, generator=g)
    meta = AttentionMetadata.build(q_lens, kv_lens, tables, BS, torch.device("cpu"), mode=mode,
                                   span_parents=[None, parents])
    assert not meta.use_paged_kernel  # the C++ kernel is causal-only
    ours = paged_attention(q, k_new, v_new, k_cache, v_cache, meta, D ** -0.5)

    def slot(table, p):
        return table[p // BS] * BS + p % BS

    ctx = kv_lens[1] - q_lens[1]
    for r in range(len(parents)):
        path, a = [], r
        while a >= 0:
            path.append(a)
            a = parents[a]
        path = path[::-1]  # span rows root .. r
        slots = torch.tensor([slot(tables[1], p) for p in range(ctx)] + [slot(tables[1], ctx + a) for a in path])
        keys = k_cache[slots].repeat_interleave(H // HKV, dim=1)
        vals = v_cache[slots].repeat_interleave(H // HKV, dim=1)
        s = torch.einsum("hd,khd->hk", q[q_lens[0] + r], keys) / D ** 0.5
        want = torch.einsum("hk,khd->hd", s.softmax(-1), vals)
        torch.testing.assert_close(ours[q_lens[0] + r], want, rtol=1e-5, atol=1e-5)
    # the chain beside it is untouched by the tree: same as in a batch of its own
    alone = AttentionMetadata.build(q_lens[:1], kv_lens[:1], tables[:1], BS, torch.device("cpu"), mode=mode)
    torch.testing.assert_close(paged_attention(q[:3], k_new[:3], v_new[:3], k_cache, v_cache, alone, D ** -0.5),
                               ours[:3], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="span_parents"):
        AttentionMetadata.build([3], [9], tables[:1], BS, torch.device("cpu"), span_parents=[[-1, 0, 2]])
