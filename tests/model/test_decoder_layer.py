"""The decoder layer is written once (models/decoder.py); its fast path, the whole layer as one C++
call over blocked weights, must agree with the reference on the same weights, rows and paged cache,
and the reference with paged attention must agree with the reference with causal attention."""
import pytest
import torch

from specserve import kernels
from specserve.attention.paged import AttentionMetadata
from specserve.kv.cache import KVCache
from specserve.models.decoder import causal, decoder_layer, fused_decoder_layer, paged
from specserve.models.eagle import EagleConfig, EagleNet, EagleServing
from specserve.models.layers import Rotary, runs_fused

H, HKV, D, HIDDEN = 4, 2, 16, 64


def _layer(blocked: bool):
    """A random layer (an EAGLE draft's decoder layer: Q8_0 blocks when blocked), and its config."""
    arch = type("Arch", (), dict(hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=H,
                                 num_key_value_heads=HKV, head_dim=D, rms_norm_eps=1e-6, rope_theta=10000.0,
                                 vocab_size=256, rope_scaling=None))()
    torch.manual_seed(0)
    net = EagleNet(EagleConfig.for_target(arch, list(range(16)))).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.2)
    return EagleServing(net, torch.device("cpu"), use_blocks=blocked), net


@pytest.mark.skipif(not kernels.available(), reason="the fused layer needs the CPU kernels")
@pytest.mark.parametrize("q_lens", [[1], [1, 1, 1], [4, 1, 3]])
def test_fused_layer_matches_the_reference(q_lens):
    serving, _ = _layer(blocked=True)
    assert serving.fused is not None
    rotary = Rotary(D, 10000.0, None, 64, None, torch.device("cpu"))
    tables = [[0, 1, 2], [3, 4, 5], [6, 7, 8]][:len(q_lens)]
    starts = [5, 9, 2][:len(q_lens)]  # tokens already cached per sequence
    kv_lens = [s + q for s, q in zip(starts, q_lens)]
    meta = AttentionMetadata.build(q_lens, kv_lens, tables, 4, torch.device("cpu"))
    assert runs_fused(serving.fused, sum(q_lens), meta)
    pos = torch.tensor([p for s, q in zip(starts, q_lens) for p in range(s, s + q)])
    cos, sin = rotary.tables(pos)
    # the cached prefix: the same random keys/values in both caches
    caches = [KVCache(1, 9, 4, HKV, D, torch.float32, torch.device("cpu")) for _ in range(2)]
    torch.manual_seed(1)
    prefix_k, prefix_v = torch.randn_like(caches[0].k), torch.randn_like(caches[0].v)
    for c in caches:
        c.k.copy_(prefix_k), c.v.copy_(prefix_v)
    x = torch.randn(sum(q_lens), HIDDEN)
    delta = torch.randn(sum(q_lens), HIDDEN)
    xr, dr = decoder_layer(x.clone(), delta, serving.layer, cos, sin, paged(caches[0].k[0], caches[0].v[0], meta, D ** -0.5),
                           1e-6, H, HKV, D)
    xf, df = fused_decoder_layer(x.clone(), delta, serving.fused, 1e-6, cos, sin, caches[1].k[0], caches[1].v[0], meta,
                                 D ** -0.5, H, HKV, D)
    torch.testing.assert_close(xf, xr, rtol=0, atol=0)  # the residual update is one add either way
    torch.testing.assert_close(df, dr, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(caches[1].k, caches[0].k, rtol=1e-5, atol=1e-5)  # same K/V written to the same slots
    torch.testing.assert_close(caches[1].v, caches[0].v, rtol=1e-5, atol=1e-5)


def test_paged_and_causal_attention_give_the_same_layer():
    """Serving (a flat batch over a paged cache) and training (a [B, L] chunk) run the same layer."""
    serving, net = _layer(blocked=False)
    rotary = Rotary(D, 10000.0, None, 64, None, torch.device("cpu"))
    L = 11
    x = torch.randn(1, L, HIDDEN)
    cos, sin = rotary.tables(torch.arange(L))
    with torch.no_grad():
        xc, dc = decoder_layer(x.clone(), None, serving.layer, cos, sin, causal, 1e-6, H, HKV, D)
    kv = KVCache(1, 3, 4, HKV, D, torch.float32, torch.device("cpu"))
    meta = AttentionMetadata.build([L], [L], [[2, 0, 1]], 4, torch.device("cpu"))
    xp, dp = decoder_layer(x[0].clone(), None, serving.layer, cos, sin, paged(kv.k[0], kv.v[0], meta, D ** -0.5),
                           1e-6, H, HKV, D)
    torch.testing.assert_close(xp + dp, (xc + dc)[0], rtol=1e-5, atol=1e-5)
