"""Speculative decoding is lossless on the real pair (issue 40): every method gives regular decoding's
greedy tokens at batch 1 and 8, and seeded runs give regular decoding's seeded tokens. And, as a
distribution, speculative sampling: Qwen2.5-Coder-1.5B drafted by its 0.5B sibling, itself drafted
for by prompt lookup (staged, 1.5B <- 0.5B <- lookup), at T = 0.8. The joint histogram of the first
3 sampled tokens over 2,000 samples must match regular decoding's (chi-square p > 0.001), and a
planted bug in the staged level's acceptance (keeping the lookup's
proposal without the 0.5B's coin flip) must make it fail.

Unseeded requests (one torch seed for the run): a seeded request is verified by sampling, so its output
is regular decoding's by construction (tests/model/test_seeded_speculative.py); what this checks is
the rejection-sampling path every unseeded request takes. The prompt makes the levels work: the first
token is one of four words, then a comma the 0.5B drafts, then a word the lookup proposes (what followed
that comma's word last time) and the 0.5B keeps with its own probability. max_tokens=5 gives the first
verify step room for 3 draft tokens (speculative/decoder.draft_room), the least with which the lookup
proposes inside the staged level (drafters/staged.py: its proposals fill the draft's middle tokens).

The distribution test takes 9 minutes on a 2-core Zen 5 (int8 activations; the rejection sampling is
the same in either mode): `make test-all` runs these."""
import collections
import math

import pytest
import torch

from specserve import LLM, SamplingParams
from specserve.drafters import staged

pytestmark = pytest.mark.full

SAMPLES = 2000
PROMPT = "Words: apple, river, stone, cloud, apple, stone, river, cloud, stone, apple, cloud, river, apple,"
KW = dict(kv_cache_gib=0.5, max_num_seqs=32, activations="int8")


def chi_square(a: collections.Counter, b: collections.Counter, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Two-sample chi-square test of homogeneity -> (statistic, degrees of freedom, p). Outcomes whose
    expected count in the smaller sample is under min_expected are pooled into one bin."""
    na, nb = sum(a.values()), sum(b.values())
    share = min(na, nb) / (na + nb)
    big = [k for k in set(a) | set(b) if (a[k] + b[k]) * share >= min_expected]
    bins = [(a[k], b[k]) for k in big]
    rest = (na - sum(x for x, _ in bins), nb - sum(y for _, y in bins))
    if sum(rest):
        bins.append(rest)
    stat = 0.0
    for x, y in bins:
        ex, ey = (x + y) * na / (na + nb), (x + y) * nb / (na + nb)
        stat += (x - ex) ** 2 / ex + (y - ey) ** 2 / ey
    df = len(bins) - 1
    p = torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64))
    return stat, df, float(p)


def test_chi_square_itself():
    same = collections.Counter({"a": 500, "b": 300, "c": 200})
    assert chi_square(same, same)[2] == pytest.approx(1.0)
    stat, df, p = chi_square(same, collections.Counter({"a": 400, "b": 300, "c": 300}))
    assert df == 2 and stat == pytest.approx(100 / 9 + 20)  # by hand: 2 x 50^2/450 + 0 + 2 x 50^2/250
    assert p == pytest.approx(math.exp(-stat / 2))  # two degrees of freedom: the survival function is exp(-x/2)


def first_three(llm: LLM, max_tokens: int) -> collections.Counter:
    torch.manual_seed(0)
    params = SamplingParams(temperature=0.8, max_tokens=max_tokens, ignore_eos=True)
    return collections.Counter(tuple(o.outputs[0].token_ids[:3]) for o in llm.generate([PROMPT] * SAMPLES, params))


def test_staged_sampling_on_the_real_pair_has_regular_decodings_distribution(monkeypatch, pulled):
    target, draft = pulled("qwen2.5-coder-1.5b"), pulled("qwen2.5-coder-0.5b")
    llm = LLM(target, **KW)
    regular = first_three(llm, 3)  # the first 3 tokens do not depend on max_tokens
    del llm
    llm = LLM(target, speculative=dict(method="staged", draft_model=draft, stages=["draft", "lookup"], fallback=False,
                                       policy="fixed", draft_len=3), **KW)
    spec = first_three(llm, 5)
    pairs = {p["pair"]: p for p in llm.spec_stats()["stages"]}
    assert pairs["draft <- lookup"]["k"]  # the lookup proposed inside the staged level
    stat, df, p = chi_square(regular, spec)
    print(f"regular vs staged: chi2 {stat:.1f}, df {df}, p {p:.3g}")
    assert p > 1e-3, (regular.most_common(8), spec.most_common(8))

    keep = staged.StagedDrafter._pick

    def keeps_every_proposal(self, r, logits, proposal):  # the planted bug: no coin flip for the proposal
        tok, q, c = keep(self, r, logits, proposal)
        return (proposal, q, float(q[proposal])) if proposal is not None and q is not None else (tok, q, c)

    monkeypatch.setattr(staged.StagedDrafter, "_pick", keeps_every_proposal)
    buggy = first_three(llm, 5)
    stat, df, p = chi_square(regular, buggy)
    print(f"regular vs the planted bug: chi2 {stat:.1f}, df {df}, p {p:.3g}")
    assert p < 1e-3


@pytest.mark.parametrize("spec", [
    dict(method="draft"), dict(method="draft", draft_vocab=65536), dict(method="staged", stages=["draft", "lookup"]),
    dict(method="suffix"), dict(method="auto"), dict(method="draft", shape="tree"),
    dict(method="draft", shape="tree", tree_top_k=2, tree_beam=1, tree_max_nodes=8)],
    ids=["draft", "draft-fr", "staged", "suffix", "auto", "draft-tree", "draft-tree-narrow"])
def test_every_method_on_the_real_pair_gives_regular_decodings_tokens_at_batch_1_and_8(spec, pair_reference):
    """Greedy, 48 tokens, 8 HumanEval prompts through the chat template, fallback off (every step drafts);
    and seeded sampling repeats, alone and in a batch."""
    target, draft, prompts, ref, seeded_ref = pair_reference
    kw = dict(spec, fallback=False)
    if spec["method"] != "suffix":
        kw["draft_model"] = draft
    llm = LLM(target, speculative=kw, **KW)
    greedy = SamplingParams(temperature=0, max_tokens=48)
    assert [llm.generate(p, greedy)[0].outputs[0].token_ids for p in prompts[:2]] == ref[:2]  # batch 1
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)] == ref  # batch 8
    assert llm.spec_stats()["accepted"] > 0
    seeded = SamplingParams(temperature=0.8, max_tokens=24, seed=11)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts[:4], seeded)] == seeded_ref


@pytest.fixture(scope="module")
def pair_reference(pulled):
    from specserve_bench.humaneval import humaneval_problems
    from specserve_bench.spec import chat_prompt
    target, draft = pulled("qwen2.5-coder-1.5b"), pulled("qwen2.5-coder-0.5b")
    llm = LLM(target, **KW)
    prompts = [chat_prompt(llm, p) for p in humaneval_problems()[20:28]]
    ref = [o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48))]
    seeded = SamplingParams(temperature=0.8, max_tokens=24, seed=11)
    seeded_ref = [o.outputs[0].token_ids for o in llm.generate(prompts[:4], seeded)]
    return target, draft, prompts, ref, seeded_ref
