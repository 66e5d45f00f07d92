"""The instructions a draft is distilled on beyond code: every category, reproducible, and disjoint
from the bench's prompts (no 8-word run in common), so the bench measures text the draft never saw."""
import re

from specserve.training.instructions import instructions
from specserve_bench.prompts import CATEGORIES


def _shingles(text: str, n: int = 8) -> set:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def test_instructions_cover_every_category_reproducibly_and_never_the_bench_prompts():
    xs = instructions(600, seed=0)
    assert len(xs) == 600
    assert {c for c, _ in xs} == {"chat", "summarisation", "translation", "math", "qa", "code"}
    assert xs == instructions(600, seed=0) and xs != instructions(600, seed=1)
    assert len({str(conv) for _, conv in xs}) > 500  # mostly distinct
    train = set().union(*(_shingles(m["content"]) for _, conv in xs for m in conv))
    bench = set().union(*(_shingles(m["content"]) for convs in CATEGORIES.values() for conv in convs for m in conv))
    assert bench and train and not (train & bench)
