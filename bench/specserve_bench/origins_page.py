"""The bench's token-origins page: a few answers with each token coloured by who proposed it (the
staged speculative decoding paper's Figure 3), HumanEval prompts and prompts beyond code, greedy at
batch 1 with the bench's speculative LLM."""
from __future__ import annotations

from specserve import origins as org
from specserve.types import SamplingParams

from .humaneval import humaneval_problems
from .prompts import CATEGORIES


def origins_page(llm, n_code: int = 2, n_chat: int = 2, max_tokens: int = 128) -> str:
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    items = [(f"HumanEval/{i}", p["prompt"], None) for i, p in enumerate(humaneval_problems()[12:12 + n_code], 12)]
    cats = list(CATEGORIES)
    items += [(cats[i % len(cats)], None, CATEGORIES[cats[i % len(cats)]][i // len(cats)]) for i in range(n_chat)]
    blocks, every = [], []
    for title, prompt, conversation in items:
        out = (llm.generate(prompt, params) if conversation is None else llm.chat(conversation, params))[0].outputs[0]
        every += out.origins
        share = ", ".join(f"{k} {v:.0%}" for k, v in org.shares(out.origins).items())
        blocks.append(org.html_block(f"{title} ({len(out.token_ids)} tokens: {share})",
                                     org.runs(llm.tokenizer, out.token_ids, out.origins)))
    share = ", ".join(f"{k} {v:.0%}" for k, v in org.shares(every).items())
    return org.html_page("Who proposed each token", blocks,
                         f"Greedy, batch 1; every token is the target's choice (speculation is lossless). All: {share}.")
