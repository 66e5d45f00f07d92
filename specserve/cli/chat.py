"""`specserve chat`: a conversation at the terminal, as `ollama run` and `llama-cli -cnv` hold one. Each
turn is the whole conversation through the model's chat template; the earlier turns' KV comes back from
the prefix cache, so a turn's wait grows with its own message, not with the conversation.

Lines from a pipe work too (`printf 'hi\\nmore\\n' | specserve chat`): one message a line. In a message:
/bye (or Ctrl-D) leaves, /clear forgets the conversation, /system TEXT sets the system prompt (and
clears), /help lists these; a message between lines of three double quotes spans several lines.
Ctrl-C stops an answer (what was shown stays in the conversation) and, at the prompt, leaves."""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
import time
from typing import Iterator, Optional, TextIO

from .args import add_sampling_args, sampling_kwargs

HELP = ("/bye leaves (Ctrl-D too), /clear forgets the conversation, /system TEXT sets the system prompt and clears, "
        '""" starts and ends a message of several lines; Ctrl-C stops an answer')


def add_chat_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system", default=None, help="the system prompt (default: none; the model's template may add one)")
    add_sampling_args(p, max_tokens=512)
    p.add_argument("--stats", action="store_true", help="after each answer, its tokens, wait and speed on stderr")


def messages(lines: Iterator[str], prompt: Optional[str], out: TextIO) -> Iterator[str]:
    """The user's messages: one a line, or the lines between two lines of three double quotes.
    prompt: written before each message where the input is a terminal (None for a pipe)."""
    block: Optional[list[str]] = None
    while True:
        if prompt is not None:
            out.write(prompt if block is None else "... ")
            out.flush()
        line = next(lines, None)
        if line is None:
            if block:
                yield "\n".join(block)
            return
        line = line.rstrip("\n")
        if block is None:
            if line.strip().startswith('"""'):
                rest = line.strip()[3:]
                if rest.endswith('"""') and len(rest) >= 3:  # """one line"""
                    yield rest[:-3]
                else:
                    block = [rest] if rest else []
            elif line.strip():
                yield line
        elif line.rstrip().endswith('"""'):
            block.append(line.rstrip()[:-3])
            yield "\n".join(block).strip("\n")
            block = None
        else:
            block.append(line)


def cmd_chat(args, llm_kwargs: dict, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    from ..engine.llm import LLM, chat_token_ids
    from ..types import SamplingParams

    llm = LLM(**llm_kwargs)
    params = SamplingParams(**sampling_kwargs(args))
    system = args.system
    history: list[dict] = []
    tty = stdin.isatty()
    context = llm.engine.max_model_len
    if tty:
        print(f"[{os.path.basename(llm.engine.model_path)}: {HELP}]", file=sys.stderr)
    # Ctrl-C at the prompt leaves (a KeyboardInterrupt; the CLI's default exits at once). During an
    # answer it only raises a flag, which the next streamed text turns into a KeyboardInterrupt: between
    # engine steps, so generate's abort frees a consistent engine (an interrupt inside a step could
    # land between the KV cache's bookkeeping updates), and the conversation goes on.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler) if main else None
    stop = threading.Event()
    try:
        for text in messages(iter(stdin.readline, ""), ">>> " if tty else None, stdout):
            if text.strip() == "/bye":
                break
            if text.strip() == "/clear":
                history = []
                print("[conversation cleared]", file=sys.stderr)
                continue
            if text.strip() == "/help":
                print(f"[{HELP}]", file=sys.stderr)
                continue
            if text == "/system" or text.startswith("/system "):
                system, history = text[len("/system"):].strip() or None, []
                print(f"[system prompt {'set' if system else 'removed'}; conversation cleared]", file=sys.stderr)
                continue
            history.append({"role": "user", "content": text})
            conv = ([{"role": "system", "content": system}] if system else []) + history
            shown: list[str] = []

            def on_text(_, __, delta, finished, shown=shown):
                shown.append(delta)
                stdout.write(delta)
                stdout.flush()
                if stop.is_set():
                    raise KeyboardInterrupt

            t0 = time.perf_counter()
            stop.clear()
            if main:
                signal.signal(signal.SIGINT, lambda *_: stop.set())
            try:
                ids = chat_token_ids(llm.tokenizer, conv)
                if len(ids) >= context:
                    raise ValueError(f"the conversation ({len(ids)} tokens) fills this model's context ({context})")
                # an answer stops where the context ends rather than being refused
                room = dataclasses.replace(params, max_tokens=min(params.max_tokens, context - len(ids)))
                out = llm.generate(ids, room, on_text=on_text)[0]
            except KeyboardInterrupt:
                stdout.write("\n")
                print("[stopped]", file=sys.stderr)
                history.append({"role": "assistant", "content": "".join(shown)})
                continue
            except ValueError as e:  # the conversation no longer fits the context, a template's refusal
                history.pop()
                print(f"[{str(e).splitlines()[0]}; /clear starts again]", file=sys.stderr)
                continue
            finally:
                if main:
                    signal.signal(signal.SIGINT, signal.default_int_handler)
            answer = out.outputs[0]
            history.append({"role": "assistant", "content": answer.text})
            stdout.write("\n")
            stdout.flush()
            if args.stats:
                wall, n = time.perf_counter() - t0, len(answer.token_ids)
                ttft = answer.time_to_first_token
                print(f"[{n} tokens in {wall:.2f} s ({n / wall:.1f} tokens/s); first token after "
                      f"{'-' if ttft is None else f'{ttft * 1e3:.0f} ms'}, {out.num_cached_tokens} of "
                      f"{len(out.prompt_token_ids)} prompt tokens from the prefix cache]", file=sys.stderr)
    except KeyboardInterrupt:  # at the prompt: leave, as a shell does on Ctrl-C at an empty line
        stdout.write("\n")
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    return 0
