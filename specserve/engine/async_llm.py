"""AsyncLLM: the engine stepping in a background thread while requests come and go (the server's API).

    llm = AsyncLLM(speculative="lookup")              # the same arguments as LLM(...)
    async for delta in llm.generate("def add(a, b):", SamplingParams(max_tokens=32)):
        print(delta.text, end="")                      # StreamDelta: text, token ids, logprobs, finish

One thread owns the engine and runs its step loop; callers (any thread, any event loop) hand it
requests and aborts through a queue, and get each step's deltas back on their own event loop. A
request joins the running batch at the next step. Leaving the `async for` early (a client gone, a
cancelled task) aborts the request at once: its KV blocks, drafter state and generator are freed.
Outputs are those of LLM.generate: the engine does not depend on what else is in the batch.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional, Union

import torch

from ..registry import MODELS
from ..types import EngineDeadError, Request, SamplingParams, StreamDelta
from .llm import LLM, chat_token_ids, prompt_token_ids
from .nbest import pick
from .omp_pool import free_thread_pool

Prompt = Union[str, list[int]]


@dataclass(frozen=True)
class EngineStats:
    """A snapshot the loop thread publishes after every step (for /metrics; reading it never waits)."""

    waiting: int = 0  # requests queued, not yet started
    running: int = 0  # requests in the running batch
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    steps: int = 0
    threads: int = 0  # CPU threads the last step used (engine/threads.py; the pinned count without its governor)
    spec: Optional[dict] = None  # LLM.spec_stats(): acceptance by position, tokens per step, speculating
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of which found (their prefill skipped)


@dataclass
class _Stream:
    """One generate call as the loop thread sees it: its n sample requests and where to send deltas."""

    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    requests: list[Request] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)  # request id -> tokens already sent
    open: int = 0  # samples not finished yet
    ranked: bool = False  # best_of / a deadline: the best samples are sent whole once all have finished


_END = object()  # after a stream's last delta


def _delta(r: Request, index: int, text: str, sent: int) -> StreamDelta:
    """What r gained since its first `sent` output tokens (the first delta: its prompt's cached tokens,
    and its log-probabilities where asked)."""
    k, pk = r.params.num_top_logprobs, (r.params.prompt_logprobs if sent == 0 else None)
    return StreamDelta(
        index=index, text=text, token_ids=list(r.output_token_ids[sent:]),
        logprobs=list(r.output_logprobs[sent:]) if r.params.wants_logprobs else None,
        top_logprobs=list(r.output_top_logprobs[sent:]) if k else None,
        origins=[o.value for o in r.output_origins[sent:]],
        finish_reason=r.finish_reason.value if r.is_finished and r.finish_reason else None,
        stop_reason=r.stop_reason if r.is_finished else None, error=r.error if r.is_finished else None,
        prompt_logprobs=None if pk is None else list(r.prompt_logprobs),
        prompt_top_logprobs=list(r.prompt_top_logprobs) if pk else None,
        num_cached_tokens=r.num_cached_tokens if sent == 0 else None)


class AsyncLLM:
    def __init__(self, *args, **kwargs):
        # An LLM of its own, built on the thread that steps it. libgomp keeps a pool of OpenMP threads
        # per thread that runs parallel regions; while the pools' threads outnumber the cores, every
        # worker sleeps after ~100 spins instead of waiting for the next region, and each of a step's
        # hundreds of regions pays a wake-up. Loading on the caller's thread left its pool beside the
        # stepping thread's: a served token took 1.6x what LLM.generate takes on 2 cores, and the
        # thread governor, seeing the sleeping workers' lost CPU time, then fell back to one thread
        # (docs/decisions.md#engine-thread). So the caller's thread runs no torch work of the engine, and
        # a pool it kept from earlier work of its own is freed (omp_pool.py).
        free_thread_pool()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # ("add", key, ids, params, stream) | ("abort", key)
        self._wake = threading.Event()
        self._keys = itertools.count()
        self._streams: dict[str, _Stream] = {}  # request_id -> stream; loop thread only
        self._by_request: dict[str, tuple[str, _Stream]] = {}  # engine request id -> (request_id, stream); loop thread only
        self._ids: set[str] = set()  # request_ids of running generate calls (callers' side)
        self._ids_lock = threading.Lock()
        self._closed = False
        self._dead: Optional[BaseException] = None
        built: queue.SimpleQueue = queue.SimpleQueue()  # the LLM, or the exception that stopped it
        self._go = threading.Event()  # set once this object is complete: the loop may start
        self._thread = threading.Thread(target=self._main, args=(args, kwargs, built), name="specserve-engine",
                                        daemon=True)
        self._thread.start()
        try:
            llm = built.get()
            if isinstance(llm, BaseException):
                self._thread.join()
                raise llm
            self._llm = llm
            self.engine = self._llm.engine
            self.tokenizer = self._llm.tokenizer
            self.config = self._llm.config
            self.max_model_len = self.engine.max_model_len
            bm = self.engine.scheduler.blocks
            self.cache_tokens = bm.num_blocks * bm.block_size  # the longest sequence the KV cache can hold
            # A known model is served under the name it was asked for (as vLLM serves --model's argument);
            # a file or directory under its base name.
            asked = self.config.model.model
            self.model_name = asked if asked in MODELS and not os.path.exists(asked) else \
                os.path.splitext(os.path.basename(os.path.normpath(self.engine.model_path)))[0]
            self.stats = EngineStats(kv_blocks_total=self.engine.scheduler.blocks.num_blocks)
        except BaseException:  # Ctrl-C while it loads, or a failure above: the thread ends once loaded
            self._closed = True
            raise
        finally:
            self._go.set()

    # --- callers' side ------------------------------------------------------------------------
    def encode(self, prompt: Prompt, add_special_tokens: bool = True) -> list[int]:
        """A prompt's token ids (a TypeError for anything but a string or a list of ints). Holds the GIL
        only briefly (the tokenizer releases it), so a server can run it in a thread for long prompts."""
        return prompt_token_ids(self.tokenizer, prompt, add_special_tokens)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: Optional[list[dict]] = None, continue_final_message: bool = False,
                    chat_template_kwargs: Optional[dict] = None) -> list[int]:
        """A conversation ([{"role", "content"}]) through the model's chat template, as LLM.chat does."""
        return chat_token_ids(self.tokenizer, messages, add_generation_prompt, tools, continue_final_message,
                              chat_template_kwargs)

    def check(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """ValueError (one line) if the request cannot be served; reads only fixed engine settings."""
        self.engine.check_request(prompt_token_ids, params)

    async def generate(self, prompt: Prompt, params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None) -> AsyncIterator[StreamDelta]:
        """Deltas of every sample (StreamDelta.index) as the engine steps, until all have finished; for
        ranked params (best_of, best_of_deadline_s) one whole delta per sample of the answer at the end,
        best first (index = rank).
        Raises ValueError before queueing anything if the request cannot be served. request_id (unique
        among running requests; default: a fresh one) is what abort() takes."""
        if self._dead is not None:
            raise EngineDeadError(f"the engine loop stopped: {self._dead!r}")
        if self._closed:
            raise RuntimeError("AsyncLLM is shut down")
        params = params or SamplingParams()
        ids = self.encode(prompt)
        self.check(ids, params)
        key = f"req-{next(self._keys)}" if request_id is None else str(request_id)
        with self._ids_lock:
            if key in self._ids:
                raise ValueError(f"request_id {key!r} is already running")
            self._ids.add(key)
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), open=params.num_samples, ranked=params.ranked)
        self._send(("add", key, ids, params, stream))
        ended = False
        try:
            while True:
                item = await stream.out.get()
                if item is _END:
                    ended = True
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not ended:  # left early (cancelled, client gone, an error): free it now
                self._send(("abort", key))
            with self._ids_lock:
                self._ids.discard(key)

    def abort(self, request_id: str) -> None:
        """Stop a running request (its generate ends with finish_reason "abort"); unknown ids are ignored."""
        self._send(("abort", str(request_id)))

    @property
    def thread_id(self) -> int:
        """The engine thread's native id (where its CPU affinity can be read)."""
        return self._thread.native_id

    def shutdown(self, timeout: float = 10.0) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout)

    def _send(self, msg: tuple) -> None:
        self._inbox.put(msg)
        self._wake.set()

    # --- the loop thread ----------------------------------------------------------------------
    def _main(self, args: tuple, kwargs: dict, built: queue.SimpleQueue) -> None:
        try:
            llm = LLM(*args, **kwargs)
        except BaseException as e:  # raised again by the constructor, on the caller's thread
            built.put(e)
            return
        built.put(llm)
        self._go.wait()
        if not self._closed:  # the constructor gave up (Ctrl-C, an error): drop the model, end the thread
            self._run()

    def _run(self) -> None:
        eng = self.engine
        try:
            while not self._closed:
                self._drain()
                if not eng.has_unfinished():
                    self._publish(stepped=False)
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                try:
                    events = eng.step()
                except Exception as e:  # a failed step: its requests end with the error, the loop goes on
                    self._fail_all(e)
                    continue
                for req, text in events:
                    self._emit(req, text)
                self._publish(stepped=True)
        except BaseException as e:  # the loop itself broke: every caller hears of it
            self._dead = e
            self._fail_all(e)

    def _drain(self) -> None:
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if msg[0] == "add":
                _, key, ids, params, stream = msg
                try:
                    stream.requests = self.engine.add_request(ids, params)
                except Exception as e:
                    self._deliver(stream, e)
                    continue
                self._streams[key] = stream
                for r in stream.requests:
                    self._by_request[r.request_id] = (key, stream)
                    stream.sent[r.request_id] = 0
            else:
                stream = self._streams.pop(msg[1], None)
                if stream is not None:
                    self.engine.abort([r.request_id for r in stream.requests])
                    for r in stream.requests:
                        if self._by_request.pop(r.request_id, None) is not None:  # tell a listener it ended
                            self._deliver(stream, StreamDelta(index=r.sample_index, text="", token_ids=[],
                                                              finish_reason="abort"))
                    self._deliver(stream, _END)

    def _emit(self, r: Request, text: str) -> None:
        entry = self._by_request.get(r.request_id)
        if entry is None:
            return
        key, stream = entry
        sent = stream.sent[r.request_id]
        stream.sent[r.request_id] = len(r.output_token_ids)
        if not stream.ranked:
            self._deliver(stream, _delta(r, r.sample_index, text, sent))
        if r.is_finished:
            self._by_request.pop(r.request_id, None)
            stream.open -= 1
            if stream.open == 0:
                if stream.ranked:  # the answer is known only now: the best samples, whole, best first
                    for rank, best in enumerate(pick(stream.requests)):
                        self._deliver(stream, _delta(best, rank, best.text, 0))
                self._deliver(stream, _END)
                self._streams.pop(key, None)

    def _fail_all(self, error: BaseException) -> None:
        for stream in list(self._streams.values()):
            try:
                self.engine.abort([r.request_id for r in stream.requests])
            except Exception:
                pass
            self._deliver(stream, error)
        self._streams.clear()
        self._by_request.clear()

    @staticmethod
    def _deliver(stream: _Stream, item) -> None:
        try:
            stream.loop.call_soon_threadsafe(stream.out.put_nowait, item)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening
            pass

    def _publish(self, stepped: bool) -> None:
        eng = self.engine
        bm = eng.scheduler.blocks
        spec = self._llm.spec_stats()
        self.stats = EngineStats(
            waiting=len(eng.scheduler.waiting), running=len(eng.scheduler.running),
            kv_blocks_used=bm.num_blocks - bm.num_free_blocks, kv_blocks_total=bm.num_blocks,
            steps=self.stats.steps + stepped,  # idle wake-ups are not steps
            threads=eng.threads.threads if eng.threads is not None else torch.get_num_threads(),
            spec=spec, prefix_cache_queries=eng.scheduler.prefix_queries, prefix_cache_hits=eng.scheduler.prefix_hits)
