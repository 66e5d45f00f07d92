"""The decoder layer is written once (models/decoder.py); its fast path, the whole layer as one C++
call over blocked weights (the Llama layer and Gemma 3's), must give the reference's bits on the same
weights, rows and paged cache,
and the reference with paged attention must agree with the reference with causal attention."""
import pytest
import torch

from specserve import kernels
from specserve.attention.paged import AttentionMetadata
from specserve.kv.cache import KVCache
from specserve.models.decoder import LayerWeights, causal, decoder_layer, fused_decoder_layer, fused_layer_weights, paged, runs_fused
from specserve.models.eagle import EagleConfig, EagleNet, EagleServing, _q8
from specserve.models.layers import Linear, Rotary

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


def _blocked_layer(kind: str, activations: str, HKV: int) -> LayerWeights:
    """A random layer over Q8_0 blocks: the Llama layer, or Gemma 3's (QK-norm, post norms, GeGLU)."""
    torch.manual_seed(2)
    cpu = torch.device("cpu")
    lin = lambda *shapes: Linear([_q8(torch.randn(*s) * 0.2) for s in shapes], None, torch.float32, cpu, True,  # noqa: E731
                                 activations)
    norm = lambda n: 1 + 0.1 * torch.randn(n)  # noqa: E731
    w = LayerWeights(attn_norm=norm(HIDDEN), ffn_norm=norm(HIDDEN),
                     qkv=lin((H * D, HIDDEN), (HKV * D, HIDDEN), (HKV * D, HIDDEN)), o=lin((HIDDEN, H * D)),
                     gate_up=lin((128, HIDDEN), (128, HIDDEN)), down=lin((HIDDEN, 128)))
    if kind == "gemma3":
        w.q_norm, w.k_norm, w.post_attn_norm, w.post_ffn_norm = norm(D), norm(D), norm(HIDDEN), norm(HIDDEN)
        w.act = "gelu_tanh"
    return w


@pytest.mark.skipif(not kernels.available(), reason="the fused layer needs the CPU kernels")
@pytest.mark.parametrize("activations", ["fp32", "int8"])
@pytest.mark.parametrize("kind,window,HKV", [("llama", 0, 2), ("gemma3", 0, 2), ("gemma3", 4, 1)])
@pytest.mark.parametrize("q_lens", [[1], [1, 1, 1], [4, 1, 3]])
def test_fused_layer_gives_the_references_bits(q_lens, kind, window, HKV, activations):
    """The same kernels in the same order: the residual update, the layer's output and the K/V written
    are the reference's bits (window 4 < the sequences' 5-10 keys: the window changes the output; one
    KV head, as Gemma 3 270M has: its slice of qkv is strided when T > 1)."""
    w = _blocked_layer(kind, activations, HKV)
    fused = fused_layer_weights(w, D)
    assert fused is not None and fused.gelu == (kind == "gemma3")
    rotary = Rotary(D, 10000.0, None, 64, None, torch.device("cpu"))
    tables = [[0, 1, 2], [3, 4, 5], [6, 7, 8]][:len(q_lens)]
    starts = [5, 9, 2][:len(q_lens)]  # tokens already cached per sequence
    kv_lens = [s + q for s, q in zip(starts, q_lens)]
    meta = AttentionMetadata.build(q_lens, kv_lens, tables, 4, torch.device("cpu"))
    assert runs_fused(fused, sum(q_lens), meta)
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
    xr, dr = decoder_layer(x.clone(), delta, w, cos, sin, paged(caches[0].k[0], caches[0].v[0], meta, D ** -0.5, window),
                           1e-6, H, HKV, D)
    xf, df = fused_decoder_layer(x.clone(), delta, fused, 1e-6, cos, sin, caches[1].k[0], caches[1].v[0], meta,
                                 D ** -0.5, H, HKV, D, window)
    assert torch.equal(xf, xr) and torch.equal(df, dr)
    assert torch.equal(caches[1].k, caches[0].k) and torch.equal(caches[1].v, caches[0].v)
    if window:  # else the windowed case would test nothing the unwindowed one does not
        _, whole = decoder_layer(x.clone(), delta, w, cos, sin, paged(caches[0].k[0], caches[0].v[0], meta, D ** -0.5),
                                 1e-6, H, HKV, D)
        assert not torch.equal(whole, dr)


def test_the_eagle_draft_runs_its_layer_fused():
    serving, _ = _layer(blocked=True)
    assert serving.fused is not None and not serving.fused.gelu and serving.fused.q_norm is None


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
