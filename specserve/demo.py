"""`make run`: the embedded model answering a chat question, completing code, and decoding the same
prompt with and without speculative decoding (same tokens, both timings, acceptance)."""
from __future__ import annotations

import sys
import time

from . import LLM, SamplingParams


def main() -> None:
    print("Loading the embedded SmolLM2-135M-Instruct (Q4_1 GGUF)...", flush=True)
    t0 = time.perf_counter()
    llm = LLM()
    print(f"loaded in {time.perf_counter() - t0:.1f} s\n")

    def stream(_, __, delta, ___):
        sys.stdout.write(delta)
        sys.stdout.flush()

    question = "Write a Python function that checks whether a number is prime."
    print(f">>> chat: {question}")
    out = llm.chat([{"role": "user", "content": question}], SamplingParams(temperature=0, max_tokens=200), on_text=stream)[0]
    m = out.metrics
    print(f"\n[{len(out.outputs[0].token_ids)} tokens, first after {m['time_to_first_token'] * 1e3:.0f} ms, "
          f"then {m['per_token_latency'] * 1e3:.1f} ms/token]\n")

    prompt = "def fibonacci(n):"
    print(f">>> 4 samples (T=0.8, seed 0) of: {prompt!r}  (one prefill, KV shared)")
    t0 = time.perf_counter()
    outs = llm.generate(prompt, SamplingParams(n=4, temperature=0.8, seed=0, max_tokens=48, stop=["\n\n"]))[0]
    wall = time.perf_counter() - t0
    for o in outs.outputs:
        print(f"--- sample {o.index} ({o.finish_reason}) ---\n{prompt}{o.text}")
    n = sum(len(o.token_ids) for o in outs.outputs)
    print(f"\n[{n} tokens in {wall:.2f} s = {n / wall:.0f} tokens/s]")

    # Prompt lookup where the text repeats, the EAGLE draft shipped for this model elsewhere (the best
    # drafter on a CPU, see the README), BASS policy.
    spec = LLM(speculative={"method": "lookup+draft"})
    prompt = 'def is_palindrome(s: str) -> bool:\n    """Return True if s reads the same backwards."""\n'
    params = SamplingParams(temperature=0, max_tokens=128)
    print(f"\n>>> the same prompt, regular vs speculative decoding (greedy, {params.max_tokens} tokens max)")
    for name, engine in (("regular", llm), ("speculative", spec)):
        engine.generate(prompt, SamplingParams(temperature=0, max_tokens=4))  # warm-up
        t0 = time.perf_counter()
        o = engine.generate(prompt, params)[0].outputs[0]
        wall = time.perf_counter() - t0
        extra = ""
        if o.accepted_per_step:
            acc, dr = sum(o.accepted_per_step), sum(o.drafted_per_step)
            extra = f", {acc}/{dr} drafts accepted over {len(o.accepted_per_step)} verify steps"
        print(f"[{name:11s}] {len(o.token_ids)} tokens in {wall:.2f} s = {len(o.token_ids) / wall:.0f} tokens/s{extra}")
        if name == "regular":
            regular = o.token_ids
        else:
            print(f"same tokens as regular decoding: {o.token_ids == regular}")
    print(prompt + o.text)


if __name__ == "__main__":
    main()
