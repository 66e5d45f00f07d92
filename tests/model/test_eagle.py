"""The EAGLE draft's two forwards agree, the training-side target equals the serving model, and
train-draft resumes from a checkpoint to the same weights as an uninterrupted run."""
import shutil

import numpy as np
import pytest
import torch

from specserve import LLM, kernels
from specserve.attention.paged import AttentionMetadata
from specserve.kv.cache import KVCache
from specserve.loading import load_model_files
from specserve.models.eagle import EagleConfig, EagleNet, EagleServing
from specserve.training import distill
from specserve.training.distill import DistillConfig, train_draft
from specserve.training.target import DenseTarget

from .tiny import make_tiny

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("llama"))
    make_tiny("llama", path)
    return path


def test_dense_target_hidden_matches_serving_model(tiny_dir):
    llm = LLM(tiny_dir, kv_cache_gib=0.01, block_size=4)
    eng = llm.engine
    ids = torch.randint(0, 256, (1, 21), generator=torch.Generator().manual_seed(0))
    n = ids.shape[1]
    meta = AttentionMetadata.build([n], [n], [list(range(-(-n // 4)))], 4, eng.device)
    logits, hidden = eng.model.forward(ids[0], torch.arange(n), meta, eng.kv.k, eng.kv.v, torch.arange(n), return_hidden=True)
    _, arch, weights, _ = load_model_files(tiny_dir, keep_quantized=False)
    target = DenseTarget(arch, weights, torch.device("cpu"))
    h = target.hidden(ids)[0]
    assert (h - hidden).abs().max() < 1e-4
    assert (target.logits(h) - logits).abs().max() < 1e-3


def _random_draft(tiny_dir, seed):
    """(arch, a draft with random weights large enough to matter, the dense target) for the tiny model."""
    _, arch, weights, _ = load_model_files(tiny_dir, keep_quantized=False)
    torch.manual_seed(seed)
    net = EagleNet(EagleConfig.for_target(arch, list(range(64)))).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.2)
    return arch, net, DenseTarget(arch, weights, torch.device("cpu"))


def test_eagle_serving_forward_matches_training_forward(tiny_dir):
    arch, net, target = _random_draft(tiny_dir, seed=0)
    L = 13
    emb, feat = torch.randn(1, L, arch.hidden_size), torch.randn(1, L, arch.hidden_size)
    cos, sin = target.rope_tables(L)
    with torch.no_grad():
        dense = net.forward_dense(emb, feat, cos, sin)[0]
    serving = EagleServing(net, torch.device("cpu"), use_blocks=False)
    kv = KVCache(1, 8, 4, arch.num_key_value_heads, arch.head_dim, torch.float32, torch.device("cpu"))
    table = [5, 2, 7, 0]  # scattered blocks
    # Two calls, as when drafting: a catch-up span of 9 rows, then 4 more.
    out = []
    for a, b in ((0, 9), (9, L)):
        meta = AttentionMetadata.build([b - a], [b], [table], 4, torch.device("cpu"))
        out.append(serving.forward(emb[0, a:b], feat[0, a:b], torch.arange(a, b), target.rotary, meta, kv.k[0], kv.v[0]))
    assert (torch.cat(out) - dense).abs().max() < 1e-4


def test_train_draft_resumes_to_the_same_weights(tiny_dir, tmp_path, monkeypatch):
    common = dict(model=tiny_dir, corpus_tokens=6000, steps=4, batch_size=2, seq_len=32, checkpoint_every=2,
                  eval_batches=1, warmup=1, draft_vocab=64)
    train_draft(DistillConfig(out=str(tmp_path / "straight"), **common), log=lambda *_: None)

    calls = {"n": 0}
    real = distill._losses

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # after the checkpoint at step 2
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(distill, "_losses", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_draft(DistillConfig(out=str(tmp_path / "resumed"), **common), log=lambda *_: None)
    monkeypatch.setattr(distill, "_losses", real)
    train_draft(DistillConfig(out=str(tmp_path / "resumed"), **common), log=lambda *_: None)

    a = EagleNet.load(str(tmp_path / "straight" / "draft")).state_dict()
    b = EagleNet.load(str(tmp_path / "resumed" / "draft")).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="other settings"):
        train_draft(DistillConfig(out=str(tmp_path / "resumed"), **{**common, "lr": 0.5}), log=lambda *_: None)


def test_continued_training_reports_the_starting_draft_on_the_same_data(tiny_dir, tmp_path):
    common = dict(model=tiny_dir, corpus_tokens=6000, batch_size=2, seq_len=32, checkpoint_every=100,
                  eval_batches=2, warmup=1, draft_vocab=64)
    train_draft(DistillConfig(out=str(tmp_path / "first"), steps=3, **common), log=lambda *_: None)
    # lr 0: the weights stay, so the held-out numbers before and after must agree exactly
    m = train_draft(DistillConfig(out=str(tmp_path / "again"), steps=2, lr=0.0, init_from=str(tmp_path / "first" / "draft"),
                                  **common), log=lambda *_: None)
    assert m["eval_top1_agreement_before"] == m["eval_top1_agreement"]
    assert m["eval_cls_loss_before"] == m["eval_cls_loss"]


def test_continued_training_grows_the_draft_vocabulary_by_the_datas_most_frequent_tokens(tiny_dir, tmp_path):
    common = dict(model=tiny_dir, corpus_tokens=6000, batch_size=2, seq_len=32, checkpoint_every=100,
                  eval_batches=1, warmup=1, steps=1)
    train_draft(DistillConfig(out=str(tmp_path / "first"), draft_vocab=40, **common), log=lambda *_: None)
    old = EagleNet.load(str(tmp_path / "first" / "draft")).cfg.vocab_ids
    (tmp_path / "again").mkdir()
    shutil.copy(tmp_path / "first" / "corpus.npy", tmp_path / "again" / "corpus.npy")  # the same data
    train_draft(DistillConfig(out=str(tmp_path / "again"), draft_vocab=56, init_from=str(tmp_path / "first" / "draft"), **common),
                log=lambda *_: None)
    new = EagleNet.load(str(tmp_path / "again" / "draft")).cfg.vocab_ids
    data = np.load(tmp_path / "again" / "corpus.npy").astype(np.int64)
    counts = np.bincount(data[:len(data) - max(32 * 4, len(data) // 50)], minlength=256)  # the training part
    assert (counts > 0).sum() > 56  # enough distinct tokens to grow all the way
    assert len(new) == 56 and set(old) <= set(new) and new == sorted(new)
    added = sorted(set(new) - set(old))
    rest = [t for t in range(256) if t not in set(new)]
    assert min(counts[added]) >= max(counts[rest])  # the most frequent of the tokens it lacked


def test_dense_target_in_bfloat16_stays_close_to_float32(tiny_dir):
    _, arch, weights, _ = load_model_files(tiny_dir, keep_quantized=False)
    ids = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(0))
    h32 = DenseTarget(arch, weights, torch.device("cpu")).hidden(ids)
    h16 = DenseTarget(arch, weights, torch.device("cpu"), torch.bfloat16).hidden(ids)
    assert h16.dtype == torch.bfloat16
    assert ((h16.float() - h32).norm() / h32.norm()) < 0.03


@pytest.mark.full  # reads the whole standard library twice: 24 s on an AVX2-only Zen 3
def test_function_prompts_private_adds_single_underscore_functions():
    from specserve.training.corpus import function_prompts
    public, more = function_prompts(10**6), function_prompts(10**6, private=True)
    assert set(public) < set(more)
    names = lambda ps: {p.split("def ", 1)[1].split("(", 1)[0] for p in ps if "def " in p}
    assert not any(n.startswith("_") for n in names(public))
    extra = names(set(more) - set(public))
    assert extra and all(n.startswith("_") and not n.startswith("__") for n in extra)


@pytest.mark.skipif(not kernels.available(), reason="no compiler / AVX2 for the block kernels")
def test_eagle_fused_layer_matches_op_by_op(tiny_dir):
    """The blocked (Q8_0) draft runs its decoder layer as one C++ call on short spans: the same
    kernels in the same order as the op-by-op path, so the same bits."""
    arch, net, target = _random_draft(tiny_dir, seed=1)
    serving = EagleServing(net, torch.device("cpu"), use_blocks=True)
    weights = serving.fused
    assert weights is not None
    emb, feat = torch.randn(7, arch.hidden_size), torch.randn(7, arch.hidden_size)
    outs = []
    for fused in (True, False):
        serving.fused = weights if fused else None
        kv = KVCache(1, 8, 4, arch.num_key_value_heads, arch.head_dim, torch.float32, torch.device("cpu"))
        out = []
        for a, b in ((0, 5), (5, 6), (6, 7)):  # a catch-up span, then single draft rows
            meta = AttentionMetadata.build([b - a], [b], [[3, 1]], 4, torch.device("cpu"))
            out.append(serving.forward(emb[a:b], feat[a:b], torch.arange(a, b), target.rotary, meta, kv.k[0], kv.v[0]))
        outs.append(torch.cat(out))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("attention", ["split", "pad"])
def test_eagle_tree_drafts_equal_the_reference_expansion(tiny_dir, tmp_path, attention):
    """The batched, level-by-level EAGLE-2 tree (fed nodes attending to their ancestors only) equals
    drafters.tree.expand driven by a reference that runs the draft as a plain chain along each path."""
    from specserve.drafters import TreeShape
    from specserve.drafters.tree import expand
    from specserve.types import Request, SamplingParams

    from .spec_checks import assert_tree_is_the_reference

    arch, net, _ = _random_draft(tiny_dir, seed=2)
    net.save(str(tmp_path / "draft"), dtype=torch.float32)
    llm = LLM(tiny_dir, kv_cache_gib=0.01, block_size=4,
              speculative=dict(method="draft", draft_model=str(tmp_path / "draft"), attention=attention))
    drafter = llm.engine.speculator.drafter
    g = torch.Generator().manual_seed(3)
    reqs = [Request(f"r{i}", torch.randint(0, 64, (n,), generator=g).tolist(), SamplingParams(temperature=0))
            for i, n in enumerate((9, 14))]
    feats = {r.request_id: torch.randn(r.num_tokens - 1, arch.hidden_size, generator=g) for r in reqs}

    def fresh():
        for r in reqs:
            drafter.release(r)
            drafter.observe(r, 0, feats[r.request_id], 0)

    depth, shape = 4, TreeShape(top_k=3, beam=2, max_nodes=100)
    fresh()
    drafts = drafter.propose(reqs, depth, None, shape).drafts

    def reference(r):
        def next_topk(paths, k):
            out = []
            for path in paths:  # the draft as a chain along the path, from a fresh catch-up
                fresh()
                assert drafter.kv.reserve(r.request_id, r.num_tokens - 1 + depth)
                f, _ = drafter._catch_up([r])
                for i, tok in enumerate(path):
                    pos = r.num_tokens - 1 + i
                    f = drafter._forward([r], f, [tok], [pos], [1], [drafter.kv.num_done[r.request_id] + i + 1])
                p, ids = torch.softmax(drafter._logits(f).float(), -1)[0].topk(k)
                out.append((ids.tolist(), p.tolist()))
            return out
        return expand(next_topk, depth, shape.top_k, shape.beam)

    for r, d in zip(reqs, drafts):
        ref = reference(r)
        fresh()  # cut to a node budget: the reranked reference
        assert_tree_is_the_reference(d, ref, depth, drafter.propose([r], depth, None, TreeShape(3, 2, max_nodes=6)).drafts[0])


def test_train_draft_answers_instructions_through_the_chat_template(tiny_dir, tmp_path):
    """--instructions: the target's answers become a third part of the data, sampled by instr_weight."""
    import json
    import shutil

    import numpy as np
    model = str(tmp_path / "chat-model")  # the tiny model with a chat template
    shutil.copytree(tiny_dir, model)
    json.dump({"add_bos_token": False, "chat_template": "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n"
               "{% endfor %}<assistant>"}, open(f"{model}/tokenizer_config.json", "w"))
    logs = []
    cfg = DistillConfig(model=model, out=str(tmp_path / "w"), corpus_tokens=6000, instructions=6, gen_tokens=8,
                        steps=1, batch_size=2, seq_len=32, eval_batches=1, warmup=1, draft_vocab=64)
    train_draft(cfg, log=logs.append)
    answers = np.load(tmp_path / "w" / "answers-6x8.npy")
    assert len(answers) > 6 * 8 and any("instruction answers" in line for line in logs)
    data, bounds = distill._data(cfg, distill.load_model_files(model, keep_quantized=False)[3], lambda *_: None)
    assert [w for _, _, w in bounds] == [pytest.approx(0.7), 0.3] and bounds[-1][1] == len(data)
