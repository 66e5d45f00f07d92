"""The diagnostic behind docs/decisions.md#probe-catchup and #staged-ceiling: the real pair beyond code at
batch 1, each prompt's speculative run paired with regular decoding right after on the same engine,
with the step counts (plain / drafting) and each staged pair's alpha and k.

    python bench/results/probe-catchup-20261127/beyond.py draft-fr-q4,staged-fr-q4 [per-category 2] [max-tokens 128]

before.log: commit 8e81fc7 (a probe paid its catch-up); after-1.log, after-2.log: the commit after it."""
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from specserve import LLM, SamplingParams  # noqa: E402
from specserve_bench.prompts import conversations  # noqa: E402

DRAFT = dict(draft_model="qwen2.5-coder-0.5b", draft_vocab=65536, draft_quant="q4_0")
CFG = {
    "draft-fr-q4": dict(method="draft", **DRAFT),
    "draft-fr-q4-k3": dict(method="draft", policy="fixed", draft_len=3, fallback=False, **DRAFT),
    "draft-fr-q4-k3fb": dict(method="draft", policy="fixed", draft_len=3, **DRAFT),
    "staged-fr-q4": dict(method="staged", stages=["draft", "lookup"], **DRAFT),
    "staged-fr-q4-ngram": dict(method="staged", stages=["draft", "ngram"], **DRAFT),
}


def rate(out) -> float:
    return 1 / out.outputs[0].per_token_latency


def main() -> None:
    methods = sys.argv[1].split(",")
    per_cat = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    for m in methods:
        llm = LLM("qwen2.5-coder-1.5b", speculative=CFG[m], activations="int8", kv_cache_gib=0.5, num_threads=2)
        tok = llm.tokenizer
        prompts = [(c, tok.encode(tok.apply_chat_template(conv), add_special_tokens=False)) for c, conv in conversations(per_cat)]
        spec = SamplingParams(temperature=0, max_tokens=max_tokens)
        plain = SamplingParams(temperature=0, max_tokens=max_tokens, speculative=False)
        llm.generate(prompts[0][1], SamplingParams(temperature=0, max_tokens=8))  # warm-up
        logs = []
        for cat, p in prompts:
            llm.reset_spec_stats()
            a = llm.generate(p, spec)[0]
            st = llm.spec_stats()
            b = llm.generate(p, plain)[0]
            r = rate(a) / rate(b)
            logs.append(math.log(r))
            pairs = [(x["pair"], round(x["alpha"] or 0, 2), round(x["k"] or 0, 2)) for x in st.get("stages", [])]
            print(f"{m:12s} {cat:10s} {r:.3f}x same={a.outputs[0].token_ids == b.outputs[0].token_ids} "
                  f"spec {rate(a):.1f} reg {rate(b):.1f} tps={st.get('tokens_per_target_step') or 0:.2f} "
                  f"alpha={st.get('alpha') or 0:.2f} steps={st['target_steps']} spec={st['spec_steps']} "
                  f"fb={st['fallback_steps']} draft_s={st['draft_seconds']:.2f} target_s={st['target_seconds']:.2f} "
                  f"c={st.get('c')} stages={pairs}", flush=True)
        g = math.exp(sum(logs) / len(logs))
        se = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else 0
        print(f"== {m}: geo mean {g:.3f}x  [{math.exp(math.log(g) - 2 * se):.3f}, {math.exp(math.log(g) + 2 * se):.3f}]",
              flush=True)
        del llm


if __name__ == "__main__":
    main()
