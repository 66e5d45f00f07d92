"""Both attention paths (the C++ paged kernel and padded SDPA) against a naive per-sequence reference
on a ragged batch whose blocks are scattered through the cache."""
import pytest
import torch

from specserve import kernels
from specserve.attention import paged
from specserve.attention.paged import AttentionMetadata, paged_attention

H, HKV, D, BS = 6, 2, 16, 4
Q_LENS, KV_LENS = [1, 3, 1, 5], [7, 20, 33, 12]


def reference(q, k_cache, v_cache, tables, window=0):
    out, t = [], 0
    for ql, kl, table in zip(Q_LENS, KV_LENS, tables):
        slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(kl)])
        keys = k_cache[slots].repeat_interleave(H // HKV, dim=1)  # [kl, H, D]
        vals = v_cache[slots].repeat_interleave(H // HKV, dim=1)
        for i in range(ql):
            pos = kl - ql + i
            lo = max(0, pos + 1 - window) if window else 0  # a sliding window: the last `window` positions
            s = torch.einsum("hd,khd->hk", q[t], keys[lo:pos + 1]) / D ** 0.5
            out.append(torch.einsum("hk,khd->hd", s.softmax(-1), vals[lo:pos + 1]))
            t += 1
    return torch.stack(out)


@pytest.mark.parametrize("window", [0, 6, 9])
@pytest.mark.parametrize("path", ["kernel", "sdpa", "split", "mixed"])
def test_ragged_paged_attention_matches_reference(path, window, monkeypatch):
    """mixed: spans of 1 take the short path, spans of 3 and 5 are padded among themselves only.
    split: SDPA per sequence (the bf16 / CUDA path). window: sliding-window layers, the window's start
    inside a block (6, 9 with blocks of 4), shorter and longer than some contexts."""
    if path in ("kernel", "mixed") and not kernels.available():
        pytest.skip("no block kernels")
    if path == "sdpa":
        monkeypatch.setattr(paged, "PAGED_KERNEL_MAX_Q", 0)
    if path == "mixed":
        monkeypatch.setattr(paged, "PAGED_KERNEL_MAX_Q", 2)
    if path == "split":
        monkeypatch.setattr(kernels, "available", lambda: False)
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
    ours = paged_attention(q, k_new, v_new, k_cache, v_cache, meta, D ** -0.5, window)
    if path == "mixed":  # a decode row gets exactly what it gets in a batch of decode rows only
        short = [0, 2]
        rows = torch.tensor([0, 4])  # their token rows in the flat batch
        alone = AttentionMetadata.build([Q_LENS[i] for i in short], [KV_LENS[i] for i in short], [tables[i] for i in short],
                                        BS, torch.device("cpu"))
        assert torch.equal(paged_attention(q[rows], k_new[rows], v_new[rows], k_cache, v_cache, alone, D ** -0.5, window),
                           ours[rows])
    # the new tokens' K/V were written into their slots first
    torch.testing.assert_close(k_cache[meta.slot_mapping], k_new)
    torch.testing.assert_close(ours, reference(q, k_cache, v_cache, tables, window), rtol=1e-5, atol=1e-5)
    if window:  # the window changes the answer (else this case would not test it)
        assert not torch.allclose(ours, reference(q, k_cache, v_cache, tables), rtol=1e-3, atol=1e-3)


def _tree_case(g, parents, q_tree):
    """A chain of 3 queries beside a tree whose last q_tree rows are queries (the rows before them
    already cached), each sequence's blocks scattered."""
    q_lens, kv_lens = [3, q_tree], [9, 10 + len(parents)]
    tables = [[3, 7, 1], [5, 0, 9, 12, 2]]
    k_cache = torch.randn(16 * BS, HKV, D, generator=g)
    v_cache = torch.randn(16 * BS, HKV, D, generator=g)
    T = sum(q_lens)
    q = torch.randn(T, H, D, generator=g)
    k_new, v_new = torch.randn(T, HKV, D, generator=g), torch.randn(T, HKV, D, generator=g)
    return q_lens, kv_lens, tables, k_cache, v_cache, q, k_new, v_new


def _slot(table, p):
    return table[p // BS] * BS + p % BS


TREE = [-1, 0, 0, 1, 1, 2, 4]  # span rows: root; 1, 2 under it; 3, 4 under 1; 5 under 2; 6 under 4
# a drafter's tree, its last level fed while three earlier rows are cached: rows 0 and 1 hang from the
# context directly, row 2 under 0, the queries 3 (under 2) and 4 (under 1)
DRAFT_TREE = [-1, -1, 0, 2, 1]


@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("path", ["kernel", "split", "pad"])
@pytest.mark.parametrize("parents,q_tree", [(TREE, len(TREE)), (DRAFT_TREE, 2)])
def test_tree_spans_attend_to_their_ancestors_only(path, parents, q_tree, window, monkeypatch):
    """Sequence 1 ends in a tree, sequence 0 is a causal chain. Every tree query must get what the
    last row of a causal chain made of its path gets; through the C++ kernel, bit for bit. With a
    sliding window, a node's window ends at its own position (context + depth), as on that chain."""
    if path == "kernel" and not kernels.available():
        pytest.skip("no block kernels")
    if path == "split":
        monkeypatch.setattr(kernels, "available", lambda: False)
    mode = "pad" if path == "pad" else "split"
    g = torch.Generator().manual_seed(1)
    q_lens, kv_lens, tables, k_cache, v_cache, q, k_new, v_new = _tree_case(g, parents, q_tree)
    meta = AttentionMetadata.build(q_lens, kv_lens, tables, BS, torch.device("cpu"), mode=mode,
                                   span_parents=[None, parents])
    assert meta.use_paged_kernel == (path == "kernel")
    ours = paged_attention(q, k_new, v_new, k_cache, v_cache, meta, D ** -0.5, window)

    L = len(parents)
    ctx = kv_lens[1] - L
    for r in range(L - q_tree, L):
        path_rows, a = [], r
        while a >= 0:
            path_rows.append(a)
            a = parents[a]
        path_rows = path_rows[::-1]  # tree rows from the top down to r
        slots = torch.tensor([_slot(tables[1], p) for p in range(ctx)] + [_slot(tables[1], ctx + a) for a in path_rows])
        if window:
            slots = slots[-window:]
        keys = k_cache[slots].repeat_interleave(H // HKV, dim=1)
        vals = v_cache[slots].repeat_interleave(H // HKV, dim=1)
        row = q_lens[0] + r - (L - q_tree)
        s = torch.einsum("hd,khd->hk", q[row], keys) / D ** 0.5
        want = torch.einsum("hk,khd->hd", s.softmax(-1), vals)
        torch.testing.assert_close(ours[row], want, rtol=1e-5, atol=1e-5)
        if path == "kernel":
            # the same keys laid out as a causal chain in a fresh cache: the kernel's answer is identical
            n = len(slots)
            kc, vc = torch.zeros(-(-n // BS) * BS, HKV, D), torch.zeros(-(-n // BS) * BS, HKV, D)
            kc[:n], vc[:n] = k_cache[slots], v_cache[slots]
            chain = AttentionMetadata.build([1], [n], [list(range(-(-n // BS)))], BS, torch.device("cpu"))
            got = paged_attention(q[row:row + 1], kc[n - 1:n].clone(), vc[n - 1:n].clone(), kc, vc, chain, D ** -0.5)
            assert torch.equal(got[0], ours[row])
    # the chain beside it is untouched by the tree: same as in a batch of its own
    alone = AttentionMetadata.build(q_lens[:1], kv_lens[:1], tables[:1], BS, torch.device("cpu"), mode=mode)
    torch.testing.assert_close(paged_attention(q[:3], k_new[:3], v_new[:3], k_cache, v_cache, alone, D ** -0.5, window),
                               ours[:3], rtol=1e-5, atol=1e-5)


def test_bad_tree_spans_are_refused():
    with pytest.raises(ValueError, match="span_parents"):  # row 2's parent is itself
        AttentionMetadata.build([3], [9], [[0, 1, 2]], BS, torch.device("cpu"), span_parents=[[-1, 0, 2]])
    with pytest.raises(ValueError, match="span_parents"):  # fewer tree rows than queries
        AttentionMetadata.build([3], [9], [[0, 1, 2]], BS, torch.device("cpu"), span_parents=[[-1, 0]])


@pytest.mark.parametrize("window", [0, 100])
def test_a_rows_bits_do_not_depend_on_its_span_the_batch_or_the_threads(window):
    """The kernel serves a sequence's queries of one KV head together (a span's rows x the heads of the
    group, cut into parts by the thread count): each row must still get the bits of the one-token step
    at its position, in a batch or alone, on one thread or two (a verify pass then gives regular
    decoding's tokens, and a prompt's KV does not depend on its chunking). Qwen2.5-0.5B's heads."""
    if not kernels.available():
        pytest.skip("no block kernels")
    h, hkv, d, bs, kv = 14, 2, 64, 16, 300
    g = torch.Generator().manual_seed(3)
    k_cache, v_cache = torch.randn(40 * bs, hkv, d, generator=g), torch.randn(40 * bs, hkv, d, generator=g)
    q = torch.randn(16 + 1, h, d, generator=g)
    tables = [list(range(19, -1, -1)), list(range(20, 40))]  # 300 keys in 19 blocks, backwards; 20 more
    ext, ids = kernels.ext(), lambda *x: torch.tensor(x, dtype=torch.long)

    def attend(rows, q_lens, kv_lens, tabs):
        starts = ids(*[sum(q_lens[:i]) for i in range(len(q_lens))])
        return ext.paged_attention(q[rows].contiguous(), k_cache, v_cache, torch.tensor(tabs), starts, ids(*q_lens),
                                   ids(*kv_lens), bs, d ** -0.5, None, None, window)

    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(attend(list(range(17)), [16, 1], [kv, 250], tables))  # a prompt chunk beside a decode row
            assert torch.equal(attend(list(range(16)), [16], [kv], tables[:1]), outs[-1][:16])
            for i in (0, 7, 15):  # the span's rows as one-token steps at their positions
                assert torch.equal(attend([i], [1], [kv - 15 + i], tables[:1]), outs[-1][i:i + 1])
        assert torch.equal(outs[0], outs[1])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("d", [16, 64])
@pytest.mark.parametrize("path", ["kernel", "kernel-tree", "pad", "split"])
def test_an_f16_cache_gives_the_bits_of_an_f32_cache_holding_its_values(path, d, monkeypatch):
    """--kv-cache-dtype float16: the new keys and values are rounded to f16 as they are written, and
    every path widens them back exactly and sums in f32, so the output must equal, bit for bit, what
    an f32 cache holding the rounded values gives (the kernel's f16 loads against its f32 loads)."""
    if path.startswith("kernel") and not kernels.available():
        pytest.skip("no block kernels")
    if path == "split":  # one SDPA call per sequence (CUDA, bf16, prompt chunks)
        monkeypatch.setattr(kernels, "available", lambda: False)
    g = torch.Generator().manual_seed(4)
    q_lens, kv_lens, tables = [1, 3, 5], [37, 20, 66], [[9, 2, 11, 4, 0, 7, 1, 3, 5, 6], [8, 10, 12, 13, 14], [15 + i for i in range(17)]]
    parents = [None, None, [-1, 0, 0, 1, 2]] if path == "kernel-tree" else None
    slots = 32 * BS
    k16, v16 = (torch.randn(slots, HKV, d, generator=g).half() for _ in range(2))
    T = sum(q_lens)
    q = torch.randn(T, H, d, generator=g)
    k_new, v_new = torch.randn(T, HKV, d, generator=g), torch.randn(T, HKV, d, generator=g)
    meta = AttentionMetadata.build(q_lens, kv_lens, tables, BS, torch.device("cpu"), span_parents=parents,
                                   mode="pad" if path == "pad" else "split")  # pad: one padded SDPA call
    assert meta.use_paged_kernel == path.startswith("kernel")
    k32, v32 = k16.float(), v16.float()
    for window in (0, 9):
        ours = paged_attention(q, k_new, v_new, k16, v16, meta, d ** -0.5, window)
        assert k16.dtype == torch.float16 and torch.equal(k16[meta.slot_mapping], k_new.half())
        rounded = paged_attention(q, k_new.half().float(), v_new.half().float(), k32, v32, meta, d ** -0.5, window)
        assert torch.equal(ours, rounded)
        # the rounding is there, and small: f16 keeps 11 bits of each value
        exact = paged_attention(q, k_new, v_new, k32.clone(), v32.clone(), meta, d ** -0.5, window)
        assert not torch.equal(ours, exact)
        torch.testing.assert_close(ours, exact, rtol=0, atol=1e-2)
