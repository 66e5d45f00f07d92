"""The GPU table of issue 41, in one process per stage (bench/gpu/check.sh runs it on a lent GPU).

Stages:
  shape   a random-weight model of Qwen2.5-Coder-1.5B's shape (28 layers, hidden 1536, FFN 8960, 12/2
          heads of 128, vocab 151936, q/k/v bias) in bf16: the engine's steps with CUDA graphs and
          eagerly, HF transformers eager and with a static cache + torch.compile (generate's own
          auto-compile), on the same weights; greedy tokens of graphed vs eager steps and vs HF.
  smollm  the embedded SmolLM2-135M (GGUF): `LLM` end to end in bf16 with and without graphs and in
          fp32, the same HF peers, speculation (the shipped EAGLE draft) vs regular decoding at batch
          1 and 8 with greedy identity per mode, and fp32 greedy identity with HF fp32.
Every section is timed on its own and its failure is recorded without stopping the others; the
JSON and markdown are rewritten after each section, so a run cut short still leaves its numbers.
`--device cpu --dry-run` runs every section with tiny sizes (a 2-layer random model, a few tokens).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections import Counter
from typing import Optional

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from specserve.engine.runner import ModelRunner  # noqa: E402
from specserve.kv.cache import KVCache  # noqa: E402
from specserve.loading.hf import _GLOBAL_NAMES, _LAYER_NAMES, arch_from_config  # noqa: E402
from specserve.models.llama import LlamaModel  # noqa: E402
from specserve.scheduler.scheduler import ScheduledRequest  # noqa: E402
from specserve.types import Request, SamplingParams  # noqa: E402

QWEN_SHAPE = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=151936, hidden_size=1536,
                  intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                  max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  bos_token_id=151643, eos_token_id=151643, initializer_range=0.02)
QWEN05_SHAPE = dict(QWEN_SHAPE, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                    num_key_value_heads=2)  # Qwen2.5-Coder-0.5B's, the 1.5B's draft model
TINY_SHAPE = dict(QWEN_SHAPE, vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)


def free() -> None:
    """Let a deleted engine's memory (its KV, its graphs' pool) go before the next one is built."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


# --- the engine's steps without its scheduler (the 1.5B shape has no tokenizer to serve) ----------
def step_decode(runner, prompts: list[list[int]], max_new: int, block_size: int, dev) -> dict:
    """Prefill every prompt in one eager step, then max_new - 1 greedy decode steps for the whole
    batch through runner.execute (graphed or eager). Returns ms/step and every sequence's tokens."""
    reqs, nxt = [], 0
    for i, ids in enumerate(prompts):
        r = Request(str(i), list(ids), SamplingParams(temperature=0, max_tokens=max_new))
        need = -(-(len(ids) + max_new + 1) // block_size)
        r.block_table = list(range(nxt, nxt + need))
        nxt += need
        reqs.append(r)
    out = runner.execute([ScheduledRequest(r, 0, len(r.prompt_token_ids)) for r in reqs])
    for r, t in zip(reqs, out.logits.argmax(-1).tolist()):
        r.output_token_ids.append(t)
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(max_new - 1):
        out = runner.execute([ScheduledRequest(r, r.num_tokens - 1, 1) for r in reqs])
        for r, t in zip(reqs, out.logits.argmax(-1).tolist()):
            r.output_token_ids.append(t)
    sync(dev)
    return {"ms_per_step": (time.perf_counter() - t0) / max(1, max_new - 1) * 1e3,
            "tokens": [r.output_token_ids for r in reqs]}


def hf_to_canonical(hf_model) -> dict:
    """An HF Llama/Qwen2 state dict under the engine's canonical names (loading/hf.py's table)."""
    w = {}
    for key, t in hf_model.state_dict().items():
        parts = key.split(".")
        if key in _GLOBAL_NAMES:
            w[_GLOBAL_NAMES[key]] = t
        elif parts[:2] == ["model", "layers"] and ".".join(parts[3:]) in _LAYER_NAMES:
            w[f"layers.{parts[2]}.{_LAYER_NAMES['.'.join(parts[3:])]}"] = t
    if "lm_head" in w and hf_model.config.tie_word_embeddings:
        del w["lm_head"]
    return w


@torch.inference_mode()
def hf_time(model, ids: list[int], batch: int, max_new: int, static: bool) -> dict:
    """Greedy generate() of `batch` copies of one prompt; ms per decode step from the time stamps of
    every step after the first (a stopping criterion that syncs and never stops). A static cache
    runs a full-length warm-up first: generate() compiles the model (torch.compile, mode
    "reduce-overhead", i.e. with CUDA graphs) for the cache's length, which max_new_tokens sets."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    stamps: list[float] = []

    class Stamp(StoppingCriteria):
        def __call__(self, input_ids, scores, **kw):
            sync(input_ids.device)
            stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    x = torch.tensor([ids] * batch, device=model.device)
    kw = dict(do_sample=False, pad_token_id=0, min_new_tokens=max_new, max_new_tokens=max_new)
    if static:
        kw["cache_implementation"] = "static"
    model.generate(x, **(kw if static else dict(kw, min_new_tokens=4, max_new_tokens=4)))  # warm-up
    sync(model.device)
    out = model.generate(x, stopping_criteria=StoppingCriteriaList([Stamp()]), **kw)
    n = out.shape[1] - len(ids)
    return {"ms_per_step": (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1) * 1e3,
            "tokens": out[0, len(ids):].tolist(), "steps": n}


def kernel_check(model, arch, dev, rec) -> None:
    """One padded step of a decode, a chain of 1 + 3 and a 4-node tree, graphed vs eager (the
    engine's reference attention) on the same KV: logits and KV close, the same argmax."""
    from specserve.engine.graph_runner import GraphModelRunner
    from specserve.types import Draft

    def fresh():
        return KVCache(arch.num_hidden_layers, 16, 16, arch.num_key_value_heads, arch.head_dim, model.dtype, dev)

    kv = fresh()
    eager = ModelRunner(model, kv, dev, attention="pad")
    g = torch.Generator().manual_seed(3)
    rs = []
    for i, n in enumerate((40, 33, 20)):
        r = Request(f"k{i}", torch.randint(50, min(5000, arch.vocab_size), (n,), generator=g).tolist(), SamplingParams())
        r.block_table = [4 * i + j for j in range(4)]
        rs.append(r)
    eager.execute([ScheduledRequest(r, 0, len(r.prompt_token_ids)) for r in rs])
    for r, t in zip(rs, (11, 12, 13)):
        r.output_token_ids = [t]
    chain, tree = Draft([21, 22, 23]), Draft([31, 32, 33], parents=[-1, -1, 0])
    step = [ScheduledRequest(rs[0], 40, 1), ScheduledRequest(rs[1], 33, 4, chain), ScheduledRequest(rs[2], 20, 4, tree)]
    kv2 = fresh()
    kv2.k.copy_(kv.k)
    kv2.v.copy_(kv.v)
    ref = eager.execute(step)
    graphed = GraphModelRunner(model, kv2, dev, "pad", max_seqs=4, max_model_len=256, max_graph_tokens=12)
    out = graphed.execute(step)
    rec.put("kernel_check", f"{model.dtype}_graph_steps", dict(graphed.counts))
    rec.put("kernel_check", f"{model.dtype}_max_logit_diff", (out.logits - ref.logits).abs().max().item())
    rec.put("kernel_check", f"{model.dtype}_logit_scale", ref.logits.abs().max().item())
    same = (out.logits.argmax(-1) == ref.logits.argmax(-1)).sum().item()
    rec.put("kernel_check", f"{model.dtype}_argmax_same", f"{same}/{out.logits.shape[0]}")
    rec.put("kernel_check", f"{model.dtype}_max_k_diff", (kv2.k.float() - kv.k.float()).abs().max().item())


def agree(a: list[int], b: list[int], eos: list[int] = ()) -> int:
    """How many leading tokens two greedy outputs share (up to the first EOS of a)."""
    n = next((i for i, t in enumerate(a) if t in eos), len(a))
    k = 0
    while k < min(n, len(b)) and a[k] == b[k]:
        k += 1
    return k


# --- stage: the 1.5B shape -----------------------------------------------------------------------------
def stage_shape(args, rec) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from specserve.engine.graph_runner import GraphModelRunner

    dev, dry = torch.device(args.device), args.dry_run
    cfg = TINY_SHAPE if dry else QWEN_SHAPE
    max_new, batches = (6, [1, 2]) if dry else (args.max_new, [1, 8, 16])
    torch.manual_seed(0)
    with rec.section("shape.load"):
        t0 = time.perf_counter()
        hf_cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}
        with torch.device(dev):
            hf = Qwen2ForCausalLM(Qwen2Config(**hf_cfg)).to(torch.bfloat16).eval()
        for n, p in hf.named_parameters():  # HF's init leaves norms at 1 and biases at 0: vary them too
            if n.endswith("norm.weight"):
                p.data.add_(torch.randn_like(p) * 0.1)
            elif n.endswith("bias"):
                p.data.normal_(0, 0.02)
        arch = arch_from_config(cfg, "random")
        model = LlamaModel(arch, hf_to_canonical(hf), torch.bfloat16, dev, use_blocks=False, max_len=2048)
        rec.put("shape", "load_s", time.perf_counter() - t0)
        rec.put("shape", "params", sum(p.numel() for p in hf.parameters()))
        rec.put("shape", "weight_bytes", model.weight_bytes)
    with rec.section("shape.kernel_check"):
        kernel_check(model, arch, dev, rec)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(100, cfg["vocab_size"], (args.prompt_len,), generator=g).tolist() for _ in range(16)]
    bs = 16
    kv = KVCache(arch.num_hidden_layers, 600 if not dry else 64, bs, arch.num_key_value_heads, arch.head_dim,
                 torch.bfloat16, dev)
    with rec.section("shape.capture"):
        graphed = GraphModelRunner(model, kv, dev, "pad", max_seqs=16, max_model_len=2048,
                                   max_graph_tokens=16 if not dry else 4, capture=dev.type == "cuda",
                                   use_triton=dev.type == "cuda")
        rec.put("shape", "capture_s", graphed.capture_s)
        rec.put("shape", "captured_sizes", graphed.sizes)
    eager = ModelRunner(model, kv, dev, attention="pad")
    tokens = {}
    for b in batches:
        with rec.section(f"shape.engine_graph.b{b}"):
            step_decode(graphed, prompts[:b], 4, bs, dev)  # warm-up
            r = step_decode(graphed, prompts[:b], max_new, bs, dev)
            rec.put("shape", f"engine_graph_b{b}_ms", r["ms_per_step"])
            tokens[("graph", b)] = r["tokens"]
    for b in batches[:1] + batches[-1:]:
        with rec.section(f"shape.engine_eager.b{b}"):
            r = step_decode(eager, prompts[:b], max_new, bs, dev)
            rec.put("shape", f"engine_eager_b{b}_ms", r["ms_per_step"])
            tokens[("eager", b)] = r["tokens"]
    with rec.section("shape.identity"):
        g1, e1 = tokens[("graph", batches[0])][0], tokens[("eager", batches[0])][0]
        rec.put("shape", "graph_vs_eager_b1_agree", f"{agree(g1, e1)}/{len(g1)}")
        gb, eb = tokens[("graph", batches[-1])], tokens[("eager", batches[-1])]
        rec.put("shape", f"graph_vs_eager_b{batches[-1]}_agree", f"{sum(agree(a, c) for a, c in zip(gb, eb))}/{sum(map(len, gb))}")
    for b in batches:
        with rec.section(f"shape.hf_eager.b{b}"):
            r = hf_time(hf, prompts[0], b, max_new, static=False)
            rec.put("shape", f"hf_eager_b{b}_ms", r["ms_per_step"])
            if b == 1:
                rec.put("shape", "graph_vs_hf_eager_b1_agree", f"{agree(tokens[('graph', 1)][0], r['tokens'])}/{max_new}")
    if dev.type == "cuda":
        for b in args.compile_batches:
            with rec.section(f"shape.hf_static_compile.b{b}"):
                t0 = time.perf_counter()
                r = hf_time(hf, prompts[0], b, max_new, static=True)
                rec.put("shape", f"hf_static_compile_b{b}_ms", r["ms_per_step"])
                rec.put("shape", f"hf_static_compile_b{b}_total_s", time.perf_counter() - t0)
    del hf, model, graphed, kv
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    with rec.section("shape.draft_passes"):
        draft_passes(args, rec, dev)


def draft_passes(args, rec, dev) -> None:
    """A random draft model of Qwen2.5-Coder-0.5B's shape (bf16, its head cut to the 65,536 most
    frequent ids, as `bench/ceiling.py --draft-vocab 65536`): ms per one-row drafting pass of B
    sequences after a prompt, its passes eager (drafters/draft_model.py) and graphed
    (cuda/draft_graph.py), and whether both pick the same greedy tokens."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from specserve.cuda.draft_graph import DraftModelGraphs
    from specserve.drafters.draft_model import DraftModelDrafter

    dry = args.dry_run
    cfg = TINY_SHAPE if dry else QWEN05_SHAPE
    steps, batches, width = (4, [1, 2], 256) if dry else (32, [1, 8, 16], 65536)
    torch.manual_seed(2)
    with torch.device(dev):
        hf = Qwen2ForCausalLM(Qwen2Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}))
    model = LlamaModel(arch_from_config(cfg, "random"), hf_to_canonical(hf.to(torch.bfloat16)), torch.bfloat16, dev,
                       use_blocks=False, max_len=2048)
    del hf
    ids = torch.arange(width, device=dev)
    t0 = time.perf_counter()
    eager, graphed = (DraftModelDrafter(model, 400 if not dry else 32, 16, "pad", vocab_ids=ids) for _ in range(2))
    graphed.graphs = DraftModelGraphs(model, graphed.kv, max(batches), 2048, width, head=graphed.head_rows)
    rec.put("draft", "capture_s", time.perf_counter() - t0)
    g = torch.Generator().manual_seed(3)
    plen = 16 if dry else args.prompt_len
    for b in batches:
        prompts = [torch.randint(100, width, (plen,), generator=g).tolist() for _ in range(b)]
        picks = {}
        for name, d in (("eager", eager), ("graph", graphed)):
            reqs = [Request(f"{name}{b}-{i}", p, SamplingParams(temperature=0)) for i, p in enumerate(prompts)]
            for r in reqs:
                assert d.reserve(r, plen + steps)
            d.prefill([(r, plen) for r in reqs])  # the prompt's pass (eager where longer than a graph's span)
            toks, times = [[p[-1]] for p in prompts], []
            # one-row passes at positions plen, plen + 1, ..., each feeding the last pick (the first feeds
            # the prompt's last token again: any token does for timing and for the two paths' agreement)
            for j in range(steps):
                sync(dev)
                t1 = time.perf_counter()
                nxt = d.score(reqs, [[t[-1]] for t in toks], [plen + j] * b).argmax(-1).tolist()
                times.append(time.perf_counter() - t1)
                for t, n in zip(toks, nxt):
                    t.append(n)
            picks[name] = [t[1:] for t in toks]
            rec.put("draft", f"{name}_b{b}_ms", 1e3 * statistics.median(times[1:]))
            for r in reqs:
                d.release(r)
        same = sum(agree(a, c) for a, c in zip(picks["graph"], picks["eager"]))
        rec.put("draft", f"graph_vs_eager_b{b}_agree", f"{same}/{b * steps}")
    rec.put("draft", "graph_passes", graphed.graphs.passes)
    del eager, graphed, model
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# --- stage: SmolLM2-135M through LLM ---------------------------------------------------------------------
def step_timer(llm) -> list:
    """Wrap the engine's step: each step's seconds (sampling included: it syncs) and the runner's
    paths it took ("graph", "fused", "eager"). Returns the list the wrapper appends to."""
    eng, log = llm.engine, []
    runner, step = eng.runner, eng.step

    def timed():
        before = dict(getattr(runner, "counts", {}))
        t0 = time.perf_counter()
        out = step()
        dt = time.perf_counter() - t0
        after = getattr(runner, "counts", {})
        log.append((dt, tuple(sorted(k for k in after if after[k] != before.get(k, 0)))))
        return out
    eng.step = timed
    return log


def decode_step_ms(log: list) -> Optional[float]:
    """The median engine step of the steps that replayed a graph only (steady decoding), in ms; of
    all steps for an engine without graphs."""
    graphed = [dt for dt, kinds in log if kinds == ("graph",)]
    steps = graphed if graphed else [dt for dt, kinds in log if not kinds]
    return statistics.median(steps) * 1e3 if steps else None


def llm_run(llm, prompts, max_new: int, ignore_eos: bool = True) -> dict:
    params = SamplingParams(temperature=0, max_tokens=max_new, ignore_eos=ignore_eos)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    tpot = [o.metrics["per_token_latency"] for o in outs if o.metrics["per_token_latency"] is not None]
    return {"ms_per_token": statistics.mean(tpot) * 1e3, "wall_s": wall,
            "tokens_per_s": sum(len(o.outputs[0].token_ids) for o in outs) / wall,
            "tokens": [o.outputs[0].token_ids for o in outs]}


def stage_smollm(args, rec) -> None:
    from specserve import LLM
    from specserve_bench import peers
    from specserve_bench.humaneval import humaneval_prompts

    dev, dry = args.device, args.dry_run
    max_new = 8 if dry else args.max_new
    n_b1 = 2 if dry else args.b1_prompts
    batches = [1, 2] if dry else [1, 8, 16]
    texts = humaneval_prompts(16)
    # one step per host sync unless a variant asks for rounds (cuda_rounds): the baselines of runs 1-8
    kw = dict(device=dev, max_num_seqs=16, kv_cache_gib=1.0 if not dry else 0.25, cuda_rounds=0,
              batch_invariant=args.batch_invariant,
              prefill_chunk=None if args.prefill_chunk == "none" else args.prefill_chunk)
    regular: dict = {}

    def sweep(tag, llm, bs_list, n1=n_b1):
        llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=8))  # warm-up
        log = step_timer(llm)
        for b in bs_list:
            with rec.section(f"smollm.{tag}.b{b}"):
                log.clear()
                ps = prompts[:n1] if b == 1 else prompts[:b]
                if b == 1:  # one sequence at a time: the batch-1 latency, over several prompts
                    runs = [llm_run(llm, [p], max_new) for p in ps]
                    r = {"ms_per_token": statistics.median(x["ms_per_token"] for x in runs),
                         "tokens": [x["tokens"][0] for x in runs]}
                else:
                    r = llm_run(llm, ps, max_new)
                    rec.put("smollm", f"{tag}_b{b}_tokens_per_s", r["tokens_per_s"])
                rec.put("smollm", f"{tag}_b{b}_ms", r["ms_per_token"])
                rec.put("smollm", f"{tag}_b{b}_step_ms", decode_step_ms(log))
                rec.put("smollm", f"{tag}_b{b}_step_paths", dict(Counter(k for _, ks in log for k in ks)))
                if args.step_log:  # every engine step of the last sequence(s) run: ms and the runner's paths
                    rec.put("smollm", f"{tag}_b{b}_steps", [(round(dt * 1e3, 3), "+".join(ks) or "-") for dt, ks in log])
                regular[(tag, b)] = r["tokens"]

    def graph_counts(llm):
        runner = llm.engine.runner
        return dict(getattr(runner, "counts", {}))

    if args.only == "profile":
        stage_profile(args, rec, kw, texts)
        return
    dt = args.spec_dtype if args.only == "spec" else "bfloat16"
    dtag = "bf16" if dt == "bfloat16" else "fp32"
    with rec.section(f"smollm.{dtag}_graph.load"):
        t0 = time.perf_counter()
        llm = LLM(dtype=dt, **kw)
        prompts = [llm.tokenizer.encode(t) for t in texts]  # token ids: the HF peers get the very same
        rec.put("smollm", f"{dtag}_graph_load_s", time.perf_counter() - t0)
        rec.put("smollm", f"{dtag}_capture_s", getattr(llm.engine.runner, "capture_s", None))
        rec.put("smollm", "runner", type(llm.engine.runner).__name__)
    if args.only == "spec":  # speculation's draft lengths and trees against regular decoding, same run
        sweep(f"{dtag}_graph", llm, [1, batches[1]])
        del llm
        free()
        variants = [] if args.rounds_only else [("auto", {"fallback": True}, True)] + [
            (f"k{k}", {"fallback": False, "policy": "fixed", "draft_len": k}, True) for k in args.spec_lens]
        for d in ([] if args.rounds_only else args.tree_depths):  # --spec-eager: the same trees without graphs
            tree = {"fallback": False, "policy": "fixed", "draft_len": d, "shape": "tree"}
            variants += [(f"tree_d{d}", tree, True)] + ([(f"tree_d{d}_eager", tree, False)] if args.spec_eager else [])
        for m in args.rounds:  # cuda/rounds.py: M rounds per host sync, regular decoding's and EAGLE chains'
            pre = f"rounds{m}"
            variants += [(f"{pre}_regular", None, True, m)] + [
                (f"{pre}_k{k}", {"fallback": False, "policy": "fixed", "draft_len": k}, True, m) for k in args.spec_lens]
            for t in args.tree_rounds:  # K levels of W nodes, each level from the top T children of the last
                k, w, top = (int(x) for x in t.split("x"))
                variants.append((f"{pre}_tree{t}", {"fallback": False, "policy": "fixed", "draft_len": k, "shape": "tree",
                                                    "tree_beam": w, "tree_top_k": top}, True, m))
        for name, opts, graphs, *m in variants:
            tag = f"{dtag}_spec_{name}"
            with rec.section(f"smollm.{tag}"):
                spec = None if opts is None else {"method": "draft", **opts}
                llm = LLM(dtype=dt, cuda_graphs=graphs, **dict(kw, speculative=spec, cuda_rounds=m[0] if m else 0))
                sweep(tag, llm, [1, batches[1]])
                if spec is not None:
                    st = llm.spec_stats()
                    rec.put("smollm", f"{tag}_stats", {k: st.get(k) for k in ("alpha", "c", "spec_steps", "drafted", "accepted")})
                driver = llm.engine.rounds
                if driver is not None:
                    r = driver.dev
                    rec.put("smollm", f"{tag}_rounds", {"seq_rounds": r.rounds, "drafted": r.drafted, "accepted": r.accepted,
                                                        "tokens_per_round": (r.rounds + r.accepted) / max(1, r.rounds),
                                                        "seconds": driver.time})
                    # per batch of n sequences: tokens a sequence gets per round, GPU ms per round (events)
                    rec.put("smollm", f"{tag}_rounds_by_batch", {
                        n: {"rounds": st[0], "tokens_per_seq_round": round(st[2] / max(1, st[1]), 3),
                            "gpu_ms_per_round": round(st[3] / st[0] * 1e3, 4)} for n, st in sorted(r.by_batch.items())})
                del llm
                free()
            for b in (1, batches[1]):
                reg, spec = regular.get((f"{dtag}_graph", b)), regular.get((tag, b))
                if reg and spec:
                    rec.put("smollm", f"{tag}_identical_b{b}", f"{sum(a == c for a, c in zip(reg, spec))}/{len(reg)}")
                    rec.put("smollm", f"{tag}_speedup_b{b}",
                            rec.get("smollm", f"{dtag}_graph_b{b}_ms") / rec.get("smollm", f"{tag}_b{b}_ms"))
        return
    sweep("bf16_graph", llm, batches)
    rec.put("smollm", "bf16_graph_steps", graph_counts(llm))
    eos = llm.tokenizer.eos_token_ids
    del llm
    with rec.section("smollm.bf16_eager"):
        llm = LLM(dtype="bfloat16", cuda_graphs=False, **kw)
        sweep("bf16_eager", llm, [1])
        del llm
    spec_kw = dict(kw, speculative={"method": "draft", "fallback": False})
    with rec.section("smollm.bf16_spec_fallback"):  # the cost model may skip drafting where it does not pay
        llm = LLM(dtype="bfloat16", **dict(kw, speculative={"method": "draft", "fallback": True}))
        sweep("bf16_spec_fallback", llm, [1, batches[1]])
        st = llm.spec_stats()
        rec.put("smollm", "bf16_spec_fallback_stats", {k: st.get(k) for k in ("alpha", "c", "spec_steps", "drafted", "accepted")})
        del llm
        free()
    for dtype in ("bfloat16", "float32"):
        tag = "bf16" if dtype == "bfloat16" else "fp32"
        if dtype == "float32":
            with rec.section("smollm.fp32_graph"):
                llm = LLM(dtype=dtype, **kw)
                sweep("fp32_graph", llm, [1, batches[1]])
                del llm
                free()
        with rec.section(f"smollm.{tag}_spec"):
            llm = LLM(dtype=dtype, **spec_kw)
            sweep(f"{tag}_spec", llm, [1, batches[1]])
            st = llm.spec_stats()
            rec.put("smollm", f"{tag}_spec_stats", {k: st.get(k) for k in ("alpha", "c", "spec_steps", "drafted", "accepted")})
            rec.put("smollm", f"{tag}_spec_steps", graph_counts(llm))
            chains = getattr(llm.engine.speculator.drafter, "chain_graphs", None)
            rec.put("smollm", f"{tag}_spec_graphed_drafts", None if chains is None else chains.counts)
            del llm
            free()
        for b in (1, batches[1]):
            with rec.section(f"smollm.{tag}_spec_identity.b{b}"):
                reg, spec = regular.get((f"{tag}_graph", b)), regular.get((f"{tag}_spec", b))
                if reg and spec:
                    same = sum(agree(a, c, eos) == len(a[:next((i for i, t in enumerate(a) if t in eos), len(a))])
                               for a, c in zip(reg, spec))
                    rec.put("smollm", f"{tag}_spec_identical_b{b}", f"{same}/{len(reg)}")
                    rec.put("smollm", f"{tag}_spec_speedup_b{b}",
                            rec.get("smollm", f"{tag}_graph_b{b}_ms") / rec.get("smollm", f"{tag}_spec_b{b}_ms"))
    # HF peers on the same GGUF (dequantised by HF's own loader)
    from specserve.loading import embedded_model_path
    path = embedded_model_path()
    ids = prompts[:n_b1]
    with rec.section("smollm.hf_fp32"):
        hf32 = peers.load_hf(path, torch.float32, dev)
        same = 0
        for i, p in enumerate(ids):
            r = hf_time(hf32, p, 1, max_new, static=False)
            if i == 0:
                rec.put("smollm", "hf_fp32_eager_b1_ms", r["ms_per_step"])
            ours = regular.get(("fp32_graph", 1), [None] * n_b1)[i]
            if ours is not None:
                same += agree(ours, r["tokens"], eos) == len(ours[:next((j for j, t in enumerate(ours) if t in eos), len(ours))])
        rec.put("smollm", "fp32_graph_identical_to_hf_fp32_b1", f"{same}/{len(ids)}")
    with rec.section("smollm.hf_bf16"):
        hf16 = peers.load_hf(path, torch.bfloat16, dev, base=hf32)
        del hf32
        for b in batches:
            rec.put("smollm", f"hf_bf16_eager_b{b}_ms", hf_time(hf16, ids[0], b, max_new, static=False)["ms_per_step"])
        if torch.device(dev).type == "cuda":
            for b in args.compile_batches:
                t0 = time.perf_counter()
                rec.put("smollm", f"hf_bf16_static_compile_b{b}_ms", hf_time(hf16, ids[0], b, max_new, static=True)["ms_per_step"])
                rec.put("smollm", f"hf_bf16_static_compile_b{b}_total_s", time.perf_counter() - t0)


# --- stage: where a speculative step's time goes (--only profile) ------------------------------------
def _annotate(obj, names: tuple, log: Optional[dict] = None, dev=None) -> None:
    """Wrap obj's methods in profiler ranges (log: also seconds per call, synced before and after)."""
    from torch.profiler import record_function
    for name in names:
        fn = getattr(obj, name, None)
        if fn is None or getattr(fn, "_annotated", False):
            continue
        label = f"{getattr(obj, '__name__', type(obj).__name__)}.{name}"

        def wrapped(*a, _fn=fn, _label=label, **k):
            if log is not None:
                sync(dev)
                t0 = time.perf_counter()
            with record_function(_label):
                out = _fn(*a, **k)
            if log is not None:
                sync(dev)
                log.setdefault(_label, []).append(time.perf_counter() - t0)
            return out
        wrapped._annotated, wrapped._wrapped = True, fn
        setattr(obj, name, wrapped)


def _phases(llm, log=None, dev=None) -> None:
    eng = llm.engine
    _annotate(eng, ("_sample_plain", "_observe"), log, dev)
    _annotate(eng.scheduler, ("schedule", "keep_rows"), log, dev)
    _annotate(eng.runner, ("execute",), log, dev)
    _annotate(eng.runner.inputs if hasattr(eng.runner, "inputs") else eng.runner, ("fill",), log, dev)
    spec = eng.speculator
    if spec is not None:
        _annotate(spec, ("propose", "learn", "record_step"), log, dev)
        import specserve.engine.llm_engine as engine_module  # verify: a function the engine calls
        _annotate(engine_module, ("verify",), log, dev)
        d = spec.drafter
        _annotate(d, ("propose", "_catch_up", "observe"), log, dev)
        inner = getattr(d, "drafter", None) or getattr(d, "model_drafter", None)
        if inner is not None:
            _annotate(inner, ("propose", "_catch_up", "observe"), log, dev)
        for cg in {getattr(x, "chain_graphs", None) for x in (d, inner)} - {None}:
            _annotate(cg, ("draft", "forward_rows"), log, dev)


def _graph_times(llm, dev, rec, tag: str) -> None:
    """GPU time of one replay of each captured graph (CUDA events over 50 replays): the floor of a step."""
    runner = llm.engine.runner
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for size in [s for s in getattr(runner, "sizes", []) if s <= 32]:
        g = runner.graphs[size][0]
        g.replay()
        ev[0].record()
        for _ in range(50):
            g.replay()
        ev[1].record()
        torch.cuda.synchronize()
        rec.put("profile", f"{tag}_target_graph_T{size}_ms", ev[0].elapsed_time(ev[1]) / 50)
    spec = llm.engine.speculator
    d = None if spec is None else spec.drafter
    cg = getattr(d, "chain_graphs", None) or getattr(getattr(d, "drafter", None), "chain_graphs", None)
    if cg is not None and cg.capture:
        for n in [s for s in cg.sizes if s in (1, 8)]:
            for name, g in zip(("head", "step"), cg.graphs[n]):
                cg.counter.zero_()
                ev[0].record()
                for _ in range(cg.K - 1 if name == "step" else 50):
                    if name == "step":
                        g.replay()
                    else:
                        g.replay()
                        cg.counter.zero_()
                ev[1].record()
                torch.cuda.synchronize()
                reps = cg.K - 1 if name == "step" else 50
                rec.put("profile", f"{tag}_eagle_{name}_graph_n{n}_ms", ev[0].elapsed_time(ev[1]) / reps)
            cg.counter.zero_()


def stage_profile(args, rec, llm_kw: dict, prompts_text: list[str]) -> None:
    """Regular and speculative (EAGLE, fixed k) bf16 decoding at batch 1 and 8 under torch.profiler:
    per-op tables (host and GPU), chrome traces, each phase's synced seconds, and every graph's replay
    time. The question it answers: what a speculative step spends beyond its target pass."""
    from torch.profiler import ProfilerActivity, profile

    from specserve import LLM
    dev = torch.device(args.device)
    max_new = 8 if args.dry_run else 64
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    variants = [("regular", None)] + [(f"spec_k{k}", {"method": "draft", "fallback": False, "policy": "fixed",
                                                      "draft_len": k}) for k in args.spec_lens]
    for name, spec in variants:
        with rec.section(f"profile.{name}"):
            llm = LLM(dtype="bfloat16", **(llm_kw if spec is None else dict(llm_kw, speculative=spec)))
            prompts = [llm.tokenizer.encode(t) for t in prompts_text]
            llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=16))  # warm-up
            for b in (1, 8):
                ps = prompts[1:1 + b]
                # unprofiled: steps and wall
                log = step_timer(llm)
                r = llm_run(llm, ps, max_new)
                steps = [dt for dt, _ in log]
                del llm.engine.step  # step_timer's wrapper
                rec.put("profile", f"{name}_b{b}_ms_per_token", r["ms_per_token"])
                rec.put("profile", f"{name}_b{b}_steps", len(steps))
                rec.put("profile", f"{name}_b{b}_step_ms_median", statistics.median(steps) * 1e3)
                rec.put("profile", f"{name}_b{b}_tokens_per_step", sum(map(len, r["tokens"])) / max(1, len(steps)))
                # profiled (ranges on the phases, no syncs added)
                _phases(llm)
                with profile(activities=acts) as prof:
                    llm_run(llm, ps, max_new)
                ka = prof.key_averages()
                with open(os.path.join(args.out, "profile.txt"), "a") as f:  # one file: the device returns 8
                    f.write(f"===== {name} batch {b}: {len(steps)} steps of {max_new} tokens per sequence\n\n")
                    for key in (("self_device_time_total", "self_cpu_time_total") if dev.type == "cuda" else ("self_cpu_time_total",)):
                        f.write(ka.table(sort_by=key, row_limit=45, max_name_column_width=60) + "\n\n")
                    f.write(ka.table(sort_by="cpu_time_total", row_limit=45, max_name_column_width=60) + "\n")
                if b == 1:
                    trace = os.path.join(args.out, f"trace-{name}-b1.json")
                    prof.export_chrome_trace(trace)
                    os.system(f"gzip -f {trace}")
                kernels = sum(e.self_device_time_total for e in ka if e.device_type == torch.autograd.DeviceType.CUDA) \
                    if dev.type == "cuda" else 0
                rec.put("profile", f"{name}_b{b}_gpu_busy_ms_per_step", kernels / 1e3 / max(1, len(steps)))
                # synced: each phase's seconds with the GPU drained before and after it
                phase_log: dict = {}
                _rewrap(llm, phase_log, dev)
                llm_run(llm, ps, max_new)
                rec.put("profile", f"{name}_b{b}_phase_ms_per_step",
                        {k: round(sum(v) * 1e3 / max(1, len(steps)), 3) for k, v in sorted(phase_log.items())})
                _unwrap(llm)
            if dev.type == "cuda":
                _graph_times(llm, dev, rec, name)
            del llm
            free()


def _objects(llm):
    eng = llm.engine
    objs = [eng, eng.scheduler, eng.runner, getattr(eng.runner, "inputs", None)]
    spec = eng.speculator
    if spec is not None:
        d = spec.drafter
        inner = getattr(d, "drafter", None) or getattr(d, "model_drafter", None)
        objs += [spec, d, inner, getattr(d, "chain_graphs", None), getattr(inner, "chain_graphs", None)]
    return [o for o in objs if o is not None]


def _unwrap(llm) -> None:
    import specserve.engine.llm_engine as engine_module
    if getattr(engine_module.verify, "_annotated", False):
        engine_module.verify = engine_module.verify._wrapped
    for o in _objects(llm):
        for k in [k for k, v in vars(o).items() if getattr(v, "_annotated", False)]:
            delattr(o, k)


def _rewrap(llm, log: dict, dev) -> None:
    _unwrap(llm)
    _phases(llm, log, dev)


# --- the record --------------------------------------------------------------------------------------
class Record:
    def __init__(self, out: str, stage: str, args):
        self.path = os.path.join(out, f"gpu-{stage}")
        gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") and torch.cuda.is_available() else None
        self.data = {"stage": stage, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "gpu": gpu,
                     "torch": torch.__version__, "python": platform.python_version(),
                     "settings": {k: v for k, v in vars(args).items()}, "results": {}, "sections_s": {}, "errors": {}}
        try:
            import triton
            self.data["triton"] = triton.__version__
        except ImportError:
            self.data["triton"] = None
        try:
            import transformers
            self.data["transformers"] = transformers.__version__
        except ImportError:
            pass

    def put(self, group: str, key: str, value) -> None:
        self.data["results"].setdefault(group, {})[key] = value
        print(f"  {group}.{key} = {value:.3f}" if isinstance(value, float) else f"  {group}.{key} = {value}", flush=True)
        self.write()

    def get(self, group: str, key: str):
        return self.data["results"].get(group, {}).get(key)

    def section(self, name: str):
        rec = self

        class _S:
            def __enter__(self):
                self.t0 = time.perf_counter()
                print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)

            def __exit__(self, et, e, tb):
                rec.data["sections_s"][name] = round(time.perf_counter() - self.t0, 2)
                if e is not None:
                    rec.data["errors"][name] = "".join(traceback.format_exception(et, e, tb))[-2000:]
                    print(f"  FAILED {name}: {et.__name__}: {e}", flush=True)
                rec.write()
                return e is not None and not isinstance(e, KeyboardInterrupt)
        return _S()

    def write(self) -> None:
        with open(self.path + ".json", "w") as f:
            json.dump(self.data, f, indent=2, default=str)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=["shape", "smollm"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes (CPU check of the script itself)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "results", "gpu"))
    p.add_argument("--max-new", type=int, default=128, help="new tokens per sequence")
    p.add_argument("--prompt-len", type=int, default=128, help="the 1.5B shape's random prompt length")
    p.add_argument("--b1-prompts", type=int, default=4, help="prompts timed one by one at batch 1")
    p.add_argument("--only", choices=["spec", "profile"],
                   help="smollm: only speculation's variants against regular decoding, or only the profile of both")
    p.add_argument("--spec-lens", default="2,3,4", help="with --only spec: fixed draft lengths to run")
    p.add_argument("--tree-depths", default="", help="with --only spec: EAGLE token trees (15 nodes) of these depths")
    p.add_argument("--spec-dtype", default="bfloat16", choices=["bfloat16", "float32"], help="with --only spec")
    p.add_argument("--spec-eager", action="store_true", help="with --only spec: trees without graphs too")
    p.add_argument("--rounds", default="16", help="with --only spec: also regular decoding and EAGLE chains "
                   "(--spec-lens) in rounds of M per host sync, for each M listed (cuda_rounds; '': none)")
    p.add_argument("--prefill-chunk", default="auto", help="smollm: the engines' prefill chunk ('none': whole prompts "
                   "in one step, so a batch's sequences all decode from the same step: decode speed alone)")
    p.add_argument("--step-log", action="store_true", help="smollm: record every engine step's ms and paths")
    p.add_argument("--rounds-only", action="store_true", help="with --only spec: the rounds variants only")
    p.add_argument("--batch-invariant", action="store_true", help="smollm: every engine with batch_invariant "
                   "(cuda/linear.py: the target's projections by one fixed tiling)")
    p.add_argument("--tree-rounds", default="", help="with --only spec: EAGLE token trees in rounds, KxWxT each "
                   "(K levels of W nodes, each level from the top T children of the last), comma-separated")
    p.add_argument("--compile-batches", default="1", help="batch sizes for HF static cache + torch.compile")
    args = p.parse_args(argv)
    args.compile_batches = [int(b) for b in args.compile_batches.split(",") if b]
    args.spec_lens = [int(k) for k in args.spec_lens.split(",") if k]
    args.rounds = [int(m) for m in args.rounds.split(",") if m]
    args.tree_rounds = [t for t in args.tree_rounds.split(",") if t]
    args.tree_depths = [int(d) for d in args.tree_depths.split(",") if d]
    if args.dry_run:
        args.prompt_len = 12
    os.makedirs(args.out, exist_ok=True)
    rec = Record(args.out, args.stage + (f"-{args.only}" if args.only else ""), args)
    t0 = time.perf_counter()
    (stage_shape if args.stage == "shape" else stage_smollm)(args, rec)
    rec.data["total_s"] = round(time.perf_counter() - t0, 1)
    rec.write()
    print(f"[{time.strftime('%H:%M:%S')}] {args.stage} done in {rec.data['total_s']} s; "
          f"{len(rec.data['errors'])} failed section(s): {', '.join(rec.data['errors']) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
