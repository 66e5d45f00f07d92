"""`specserve bench ...`: each benchmark's flags, and which function runs it (BENCHES)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from ..registry import DRAFTERS, resolve
from .args import Parser, model_path, positive_float, positive_int, temperature
from .engine_args import NO_SPECULATION, add_model_args, add_spec_args


@dataclass(frozen=True)
class Bench:
    help: str
    run: str  # "module:function" run with the parsed flags (imported only when that bench runs)
    add_args: Callable[[argparse.ArgumentParser], None]


def _serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rates", default="0.25,0.5,1,2", help="request rates to test, requests/s")
    p.add_argument("--modes", default="regular,forced,auto", help="regular decoding, speculation forced on, automatic")
    p.add_argument("--duration", type=positive_float, default=60, help="seconds of arrivals per rate")
    p.add_argument("--arrivals", choices=("poisson", "gamma"), default="poisson")
    p.add_argument("--cv", type=positive_float, default=1.0, help="coefficient of variation of Gamma arrivals")
    p.add_argument("--max-tokens", type=positive_int, default=256, help="cap on the drawn output lengths")
    p.add_argument("--slo-ttft", type=positive_float, default=2.0, help="goodput SLO: time to first token, s")
    p.add_argument("--slo-tpot", type=positive_float, default=0.1, help="goodput SLO: time per output token, s")
    p.add_argument("--speculative", choices=DRAFTERS.names(), default="draft", help="the drafter of forced and auto")
    p.add_argument("--model", type=model_path, default=None)
    p.add_argument("--serve-args", default="",
                   help="more `specserve serve` flags for every mode, e.g. --serve-args='--activations int8'")
    p.add_argument("--peers", default="", help="peers under the same load in the same run: llama-server "
                   "(`make llamacpp-server`; 16 slots, the same GGUF file)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results")


def _decode(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=positive_int, default=3, help="HumanEval prompts for batch 1")
    p.add_argument("--max-tokens", type=positive_int, default=128)
    p.add_argument("--batch-sizes", default="1,2,4,8")
    p.add_argument("--peers", default="hf-fp32,hf-bf16,llama.cpp", help="comma list; missing ones are skipped")
    p.add_argument("--peer-batch-sizes", default="1,8",
                   help="the batch sizes HF runs at (of --batch-sizes; HF fp32 of a 1.5B model takes minutes a run)")
    p.add_argument("--out", default="bench/results")
    add_model_args(p)


def _staged(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stage-model", default="target",
                   help="the standalone draft model staged: a model path, or target (the serving model itself)")
    p.add_argument("--mid-model", default=None, help="the 3-level chain's middle model (default: --stage-model)")
    p.add_argument("--last", default="lookup", choices=("lookup", "ngram"), help="the lowest stage")
    p.add_argument("--draft-len", type=positive_int, default=4, help="the target's fixed draft length k")
    p.add_argument("--prompts", type=positive_int, default=12, help="HumanEval prompts")
    p.add_argument("--first", type=int, default=12, help="the first HumanEval problem")
    p.add_argument("--max-tokens", type=positive_int, default=128)
    p.add_argument("--threshold-table", action=argparse.BooleanOptionalAction, default=True,
                   help="the survey's threshold-decoding table (threshold vs fixed k = 1, 8, 16 on its three prompts)")
    p.add_argument("--threshold-repeats", type=positive_int, default=3, help="runs per prompt and setting (the best counts)")
    p.add_argument("--out", default="bench/results")
    add_model_args(p)


def _guided(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speculative", choices=DRAFTERS.names(), default="auto", help="the drafter of the +spec configurations")
    p.add_argument("--samples", type=positive_int, default=4, help="samples at T=1 per schema and round (besides greedy)")
    p.add_argument("--rounds", type=positive_int, default=1)
    p.add_argument("--schemas", type=positive_int, default=5, help="the first N of the bench's schemas (flat ... formats)")
    p.add_argument("--max-tokens", type=positive_int, default=300)
    p.add_argument("--out", default="bench/results")
    add_model_args(p)


def _prefix(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefix-tokens", type=positive_int, default=1000, help="the system prompt's length, about")
    p.add_argument("--rounds", type=positive_int, default=5)
    p.add_argument("--shared", type=int, default=3, help="more questions per round with the same system prompt")
    p.add_argument("--max-tokens", type=positive_int, default=32)
    p.add_argument("--out", default="bench/results")
    add_model_args(p)


def _sarathi(p: argparse.ArgumentParser) -> None:
    p.add_argument("--decoders", type=positive_int, default=4, help="requests decoding while the long prompts arrive")
    p.add_argument("--max-tokens", type=positive_int, default=96, help="tokens each decoder generates")
    p.add_argument("--long", type=positive_int, default=3, help="long prompts arriving per round")
    p.add_argument("--long-tokens", type=positive_int, default=1500, help="their length, about")
    p.add_argument("--first-arrival", type=float, default=0.3, help="seconds after the start")
    p.add_argument("--every", type=float, default=1.0, help="seconds between arrivals")
    p.add_argument("--chunk", type=positive_int, default=None, help="also run this fixed chunk")
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--limit-s", type=float, default=300.0, help="a round stops after this long, finished or not")
    p.add_argument("--out", default="bench/results")
    add_model_args(p)


def _nbest(p: argparse.ArgumentParser) -> None:
    p.add_argument("--problems", type=positive_int, default=40, help="the first N HumanEval problems")
    p.add_argument("--budget", type=positive_float, default=2.0, help="seconds per problem (best_of_deadline_s)")
    p.add_argument("--batch-sizes", default="1,2,4,8,16", help="samples per problem")
    p.add_argument("--max-tokens", type=positive_int, default=300)
    p.add_argument("--temperature", type=temperature, default=0.8)
    p.add_argument("--speculative", choices=DRAFTERS.names(), default="draft", help="the speculative engine's method")
    p.add_argument("--out", default="bench/results")
    add_model_args(p)


def _spec(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-sizes", default="1,2,4,8,16")
    p.add_argument("--settings", default="greedy,sampling", help="greedy and/or sampling (T=0.2, top-p 0.95), or none")
    p.add_argument("--sequences", type=positive_int, default=64, help="sequences per batch size (batches of that size)")
    p.add_argument("--min-rounds", type=positive_int, default=8,
                   help="at least this many batches per batch size (one batch's speedup moves by ~10%% with the VM)")
    p.add_argument("--max-tokens", type=positive_int, default=128)
    p.add_argument("--ablation-batch", type=positive_int, default=4)
    p.add_argument("--ablations", action=argparse.BooleanOptionalAction, default=True, help="PAD/SPLIT and policies")
    p.add_argument("--pass-at-1", action=argparse.BooleanOptionalAction, default=True, help="all 164 problems, RD and spec")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True, help="HF transformers, llama.cpp")
    p.add_argument("--peer-prompts", type=positive_int, default=3)
    p.add_argument("--shapes", action=argparse.BooleanOptionalAction, default=True,
                   help="chains vs token trees vs auto, on HumanEval and on prompts beyond code")
    p.add_argument("--forced", action=argparse.BooleanOptionalAction, default=True,
                   help="with --shapes: forced configurations (pad, tree, fixed k=8, lookup) against RD")
    p.add_argument("--tree-sizes", action=argparse.BooleanOptionalAction, default=True,
                   help="batch 1, fallback off: tokens per target step and speed as trees grow")
    p.add_argument("--shape-sequences", type=positive_int, default=16, help="sequences per batch size in the shapes part")
    p.add_argument("--shape-min-rounds", type=positive_int, default=4)
    p.add_argument("--per-category", type=positive_int, default=8, help="prompts per category beyond code (at most 8)")
    p.add_argument("--origins-prompts", type=int, default=2,
                   help="an HTML page of this many HumanEval and as many chat answers coloured by token origin (0: none)")
    p.add_argument("--out", default="bench/results")
    add_model_args(p)
    add_spec_args(p, default="draft")


# The benchmarks, by the name `specserve bench NAME` takes.
BENCHES = {
    "serve": Bench(
        "open-loop load on the server: TTFT/TPOT/ITL, goodput vs rate, regular/forced/auto",
        "specserve_bench.serve:run_serve_bench", _serve),
    "decode": Bench(
        "regular decoding: ms/token, TTFT, tokens/s vs peers",
        "specserve_bench.decode:run_decode_bench", _decode),
    "staged": Bench(
        "staged / hierarchical drafting vs plain speculation and regular decoding: "
        "the staged paper's and the MIT report's tables",
        "specserve_bench.staged:run_staged_bench", _staged),
    "guided": Bench(
        "guided generation: validity, tokens/s with and without fast-forward and "
        "speculation, llguidance vs xgrammar",
        "specserve_bench.guided:run_guided_bench", _guided),
    "prefix": Bench(
        "prefix caching: time to first token of a second chat turn and of a shared "
        "system prompt, with and without the cache",
        "specserve_bench.prefix:run_prefix_bench", _prefix),
    "sarathi": Bench(
        "chunked prefill with decode-maximal batching vs whole-prompt prefill: the "
        "decoders' inter-token latency while long prompts arrive",
        "specserve_bench.sarathi:run_sarathi_bench", _sarathi),
    "nbest": Bench(
        "BASS section 4.5: HumanEval Pass@First / Pass@All within a time budget vs batch "
        "size, regular vs speculative",
        "specserve_bench.nbest:run_nbest_bench", _nbest),
    "spec": Bench(
        "speculative vs regular decoding: the BASS tables, ablations, Pass@1, peers",
        "specserve_bench.spec:run_spec_bench", _spec),
}


def add_bench_args(b: argparse.ArgumentParser) -> None:
    bsub = b.add_subparsers(dest="bench", required=True, parser_class=Parser)
    for name, bench in BENCHES.items():
        bench.add_args(bsub.add_parser(name, help=bench.help))


def run_bench(args: argparse.Namespace) -> int:
    if args.bench == "spec" and args.speculative == NO_SPECULATION:
        raise ValueError("bench spec compares speculative decoding with regular decoding; "
                         f"pick --speculative {'|'.join(DRAFTERS.names())}")
    resolve(BENCHES[args.bench].run)(args)
    return 0
