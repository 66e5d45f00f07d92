"""Forward-pass time vs the tokens in the pass, measured through the public `LLM` API: the cost
table of the planner's LLM mode (`specserve profile --llm`, read by `specserve plan --llm`).

Small passes are timed as decode steps of b sequences (one token each), every prompt already in:
the engine's steps, each timed alone. Large ones are prefills of one prompt (in the engine's
chunks), which is what passes of those sizes are when serving. The prefills are also kept as a
curve of their own from 16 tokens up (`PassProfile.prefill_s`: what a SARATHI chunk of a prompt costs
beside decode rows), with the chunk the engine measured (meta["prefill_chunk"]). Every core by
default: an LLM-mode device is this machine, as `specserve bench spec` (alpha, c) ran it.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Optional

from specserve.planner.llm import PassProfile

DECODE_BATCHES = (1, 2, 4, 8, 16, 32)
PREFILL_TOKENS = (64, 128, 256, 512, 1024)
PREFILL_CURVE = (16, 32) + PREFILL_TOKENS  # prompt lengths of the prefill curve
_STEPS = 16  # decode steps timed per batch


def profile_passes(model=None, reps: int = 3, threads: Optional[int] = None, context: int = 8) -> PassProfile:
    """context: the prompt length behind each decode step timed (attention reads that much KV)."""
    from specserve import LLM, SamplingParams
    from specserve.drafters.draft_model import default_draft_path
    from specserve.loading import EMBEDDED_FILE, resolve_model_path

    threads = threads or os.cpu_count() or 1
    # no prefix caching: each prefill is timed on the same prompt again, which the cache would skip
    llm = LLM(model, num_threads=threads, max_num_batched_tokens=2048, enable_prefix_caching=False)
    vocab = llm.engine.arch.vocab_size
    ids = lambda n, seed: [(seed * 7919 + i * 104729) % (vocab - 100) + 100 for i in range(n)]  # noqa: E731

    def timed(prompts, max_tokens):
        p = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        t0 = time.perf_counter()
        llm.generate(prompts, p)
        return time.perf_counter() - t0

    def median(prompts, max_tokens):
        timed(prompts, max_tokens)  # warm-up
        return statistics.median(timed(prompts, max_tokens) for _ in range(reps))

    # decode steps are timed once every prompt is in: with whole prompts (up to 2,048 tokens a step), so
    # that the first sequences do not decode far past `context` while the last are prefilled in chunks
    whole = LLM(model, num_threads=threads, max_num_batched_tokens=2048, enable_prefix_caching=False, prefill_chunk=None)

    def decode_steps(b):
        """Seconds of one engine step of b sequences decoding, every prompt in (the prompts' chunks and
        the decodes beside them are not in it)."""
        eng = whole.engine
        p = SamplingParams(max_tokens=2 * _STEPS + 4, temperature=0.0, ignore_eos=True)
        reqs = [eng.add_request(ids(context, s), p)[0] for s in range(b)]
        while any(not r.output_token_ids for r in reqs):
            eng.step()
        eng.step()
        t0 = time.perf_counter()
        for _ in range(_STEPS):
            eng.step()
        dt = (time.perf_counter() - t0) / _STEPS
        eng.abort([r.request_id for r in reqs])
        while eng.has_unfinished():
            eng.step()
        return dt

    seconds, prefill = {}, {}
    for b in DECODE_BATCHES:
        decode_steps(b)  # warm-up
        seconds[b] = statistics.median(decode_steps(b) for _ in range(reps))
    for n in PREFILL_CURVE:
        prefill[n] = median([ids(n, 1)], 1)
    seconds.update({n: prefill[n] for n in PREFILL_TOKENS})
    arch = llm.engine.arch
    kv_bytes = arch.num_hidden_layers * arch.num_key_value_heads * arch.head_dim * 2 * 4  # float32 K and V
    path = resolve_model_path(model)
    meta = {"threads": threads, "reps": reps, "decode_context": context, "decode_batches": list(DECODE_BATCHES),
            "prefill_tokens": list(PREFILL_TOKENS), "prefill_chunk": llm.engine.prefill_chunk,
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    if os.path.basename(path) == EMBEDDED_FILE:  # the EAGLE draft that ships for it: one decoder layer
        draft_dir = default_draft_path(path)
        meta["draft"] = {"path": os.path.basename(draft_dir),
                         "weights_gb": os.path.getsize(os.path.join(draft_dir, "model.safetensors")) / 1e9,
                         "kv_gb_per_token": kv_bytes / arch.num_hidden_layers / 1e9}
    name = "embedded" if model is None else os.path.splitext(os.path.basename(model.rstrip("/")))[0].lower()
    tokens = sorted(seconds)
    weights = (sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) if os.path.isdir(path)
               else os.path.getsize(path))
    return PassProfile(name, tokens, [seconds[n] for n in tokens], weights / 1e9, kv_bytes / 1e9, meta,
                       list(PREFILL_CURVE), [prefill[n] for n in PREFILL_CURVE])
