"""What one Ray actor runs: an AsyncLLM of its own, its generate streamed back delta by delta.

"cores" keeps the engine's threads (its loop and the kernels' threads, started after the mask is set)
to a planner device's cores. Ray's own threads (the actor's event loop, which streams the deltas, and
its gRPC pollers) are left to the OS, as vLLM's CPU backend binds only its OpenMP threads: pinned to
the engine's core as well, they took its time at every token (docs/decisions.md#replica-cores).

The actor is asynchronous (Ray runs its methods on one event loop), so a thousand requests can be
in flight on it while its engine thread steps them in one batch, as in a single-process server.
Cancelling a streamed generate (the router does when its client goes away) cancels the coroutine,
and AsyncLLM.generate's own clean-up aborts the request: its KV blocks are freed at once.
"""
from __future__ import annotations

import os
from typing import Optional

from ..types import SamplingParams


class Replica:
    def __init__(self, name: str, llm_kwargs: dict, cores: Optional[tuple[int, ...]] = None):
        from ..engine.async_llm import AsyncLLM
        if cores is not None:  # before the engine starts its threads: they inherit the mask
            os.sched_setaffinity(0, set(cores))
        self.name = name
        self.llm = AsyncLLM(**llm_kwargs)

    def describe(self) -> dict:
        """What the router needs to serve this model without asking again: the tokenizer travels pickled."""
        return {"served": self.name, "model_name": self.llm.model_name, "max_model_len": self.llm.max_model_len,
                "cache_tokens": self.llm.cache_tokens,
                "tokenizer": self.llm.tokenizer, "pid": os.getpid(),
                "cores": sorted(os.sched_getaffinity(self.llm.thread_id)),
                "kv_blocks_total": self.llm.stats.kv_blocks_total}

    def check(self, prompt_token_ids: list[int], params: SamplingParams) -> Optional[str]:
        """None, or the one line saying why the request cannot be served (AsyncLLM.check's ValueError)."""
        try:
            self.llm.check(prompt_token_ids, params)
        except ValueError as e:
            return str(e).splitlines()[0]
        return None

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str):
        async for delta in self.llm.generate(prompt_token_ids, params, request_id=request_id):
            yield delta

    def abort(self, request_id: str) -> None:
        self.llm.abort(request_id)

    def stats(self):
        return self.llm.stats

    def shutdown(self) -> None:
        self.llm.shutdown()
