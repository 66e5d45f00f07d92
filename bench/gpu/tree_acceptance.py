"""Tokens a round for the GPU rounds' draft shapes (cuda/rounds.py), measured on CPU: the round bodies
run uncaptured with the torch forms of the fused ops, so the drafts, the verification and the accepted
tokens are the GPU's up to float rounding, and only the time is not. A chain of K against token trees of
K levels of W nodes (top T children a node; T = 1: W chains from the draft's best W first tokens), for
SmolLM2-135M and its EAGLE head on HumanEval prompts, greedy, EOS ignored; every variant's output is
checked against regular decoding's.

    python bench/gpu/tree_acceptance.py [--prompts 6] [--max-new 96] [--shapes 3x1x1,3x4x4]
        -> bench/results/tree-acceptance-<time>.{md,json}
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # specserve_bench

from specserve import LLM, SamplingParams  # noqa: E402
from specserve.cuda.eagle_graph import EagleChainGraphs  # noqa: E402
from specserve.engine import rounds  # noqa: E402
from specserve.engine.graph_runner import GraphModelRunner  # noqa: E402
from specserve_bench.humaneval import humaneval_prompts  # noqa: E402
from specserve_bench.machine import cpu  # noqa: E402
from specserve_bench.output import write_results  # noqa: E402

KW = dict(block_kernels=False, max_model_len=1024, prefill_chunk=None, kv_cache_gib=0.1)


def with_rounds(llm: LLM, K: int, W: int, T: int, max_rounds: int = 8):
    """What LLMEngine builds on CUDA with cuda_rounds, on CPU without capture or Triton."""
    eng = llm.engine
    eager = eng.runner
    eng.runner = GraphModelRunner(eager.model, eager.kv, eager.device, eager.attention, eager.plain_attention,
                                  max_seqs=8, max_model_len=KW["max_model_len"], max_graph_tokens=32 * W,
                                  max_step_tokens=1024, use_triton=False)
    d = eng.speculator.drafter
    d.chain_graphs = EagleChainGraphs(d, 8, KW["max_model_len"], capture=False, use_triton=False)
    sc = eng.config.speculative
    sc.draft_len = K
    if W > 1:
        sc.shape, sc.tree_beam, sc.tree_top_k = "tree", W, T
    eng.rounds = rounds.build(eng.runner, eng.speculator, max_rounds, eng.config)
    return eng.rounds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--shapes", default="2x1x1,3x1x1,4x1x1,3x4x1,2x4x4,3x4x4,4x4x4,3x6x6",
                    help="KxWxT: K levels (a chain's K draft tokens) of W nodes, each from the top T children")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    texts = humaneval_prompts(args.prompts)
    params = SamplingParams(temperature=0, max_tokens=args.max_new, ignore_eos=True)
    plain = LLM(**KW)
    ref = [plain.generate([p], params)[0].outputs[0].token_ids for p in texts]
    rows = []
    for shape in args.shapes.split(","):
        K, W, T = (int(x) for x in shape.split("x"))
        llm = LLM(speculative={"method": "draft", "fallback": False}, **KW)
        r = with_rounds(llm, K, W, T)
        got = [llm.generate([p], params)[0].outputs[0].token_ids for p in texts]  # one at a time: batch 1
        d = r.dev
        rows.append({"shape": shape, "K": K, "W": W, "T": T, "verify_rows": d.Rv, "rounds": d.rounds,
                     "tokens_per_round": (d.rounds + d.accepted) / d.rounds, "moved": int(getattr(d, "moved", 0)),
                     "identical": f"{sum(a == b for a, b in zip(got, ref))}/{len(ref)}"})
        print(rows[-1], flush=True)
        del llm
    base = {r["K"]: r["tokens_per_round"] for r in rows if r["W"] == 1}
    machine = cpu()
    lines = ["# Tokens a round of the GPU rounds' draft shapes (measured on CPU)", "",
             f"CPU: {machine['cpu']}; {', '.join(machine['flags'])}; {args.threads} threads. "
             f"`python bench/gpu/tree_acceptance.py --prompts {args.prompts} --max-new {args.max_new} --shapes {args.shapes}`: "
             f"SmolLM2-135M (fp32, dense) and its EAGLE head, HumanEval prompts 0-{args.prompts - 1} one at a time, "
             f"greedy, {args.max_new} tokens, EOS ignored; rounds uncaptured on CPU.", "",
             "| shape (K x W x T) | verify rows a sequence | tokens a round | vs the chain of K | rounds | "
             "accepted nodes moved | identical to regular decoding |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        vs = f"{r['tokens_per_round'] / base[r['K']]:.2f}x" if r["K"] in base else "-"
        lines.append(f"| {r['shape']} | {r['verify_rows']} | {r['tokens_per_round']:.3f} | {vs} | {r['rounds']} | "
                     f"{r['moved']} | {r['identical']} |")
    write_results({"machine": machine, "args": vars(args), "rows": rows}, args.out, "tree-acceptance",
                  lambda _: "\n".join(lines) + "\n", _plot)
    return 0


def _plot(result: dict, path: str) -> None:
    """Tokens a round by draft shape: chains grey, trees blue."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar([r["shape"] for r in rows], [r["tokens_per_round"] for r in rows],
           color=["#999999" if r["W"] == 1 else "#3b6ea5" for r in rows])
    ax.set_xlabel("draft shape: K levels x W nodes x top-T children (W = 1: a chain of K)")
    ax.set_ylabel("tokens a round")
    ax.set_title("GPU rounds' draft shapes, acceptance measured on CPU (SmolLM2-135M + EAGLE)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
