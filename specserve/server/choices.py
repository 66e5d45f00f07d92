"""One response's choices, built from the engine's deltas: the part /v1/completions and
/v1/chat/completions share (as vLLM's serving_completion and serving_chat share their base).

Both endpoints answer with the same choice object, {"index", <body>, "logprobs", "finish_reason",
"stop_reason"}; only the body ("text" or the chat "delta"/"message") and the logprobs' shape differ,
and a ChoiceFormat (routes/completions.py, routes/chat.py) writes those. Everything else is here, once:
which choice a delta belongs to (prompt i's sample k is choice i * n + k), when a streamed delta is
worth a chunk, the text offset each choice has reached, the origin runs of a streamed choice, the
finish and stop reasons, and the usage counts. No asyncio, HTTP or metrics: a unit test feeds it
deltas (tests/unit/test_server_choices.py).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

from ..origins import OriginRuns
from ..types import StreamDelta

LOGPROB_FLOOR = -9999.0  # vLLM's: a masked-out token's -inf is written as this (JSON has no infinity)


def json_logprob(x: float) -> float:
    """A log-probability JSON can carry: -inf (a token a mask, allowed_token_ids or a bias ruled out) and
    NaN as LOGPROB_FLOOR."""
    return x if x >= LOGPROB_FLOOR else LOGPROB_FLOOR


class ChoiceFormat(Protocol):
    """How one endpoint writes a choice's body and logprobs."""

    delta_key: str  # the body's key in a streamed choice ("text", "delta")
    message_key: str  # ... and in a whole one ("text", "message")

    def delta(self, c: int, d: StreamDelta, first: bool) -> Any:
        """Choice c's streamed body; falsy when the delta has nothing of its own to send."""

    def logprobs(self, c: int, d: StreamDelta, offset: int, first: bool) -> Optional[dict]:
        """Choice c's logprobs of the delta (None if not asked); offset: the choice's text length before
        it; first: the choice's first delta."""

    def start(self, c: int) -> Any:
        """Whole choice c's body before its first delta (empty; completions' echo: the prompt)."""

    def extend(self, c: int, choice: dict, d: StreamDelta, lp: Optional[dict]) -> None:
        """Fold the delta's text and logprobs (from logprobs()) into whole choice c."""

    def finish_reason(self, c: int, d: StreamDelta) -> Optional[str]:
        """Choice c's finish reason, given its last delta (chat's "tool_calls" for an answer of calls)."""


class Choices:
    """The choices of one response. A stream calls chunk() for every delta, a whole response add()
    and then choices(); usage() after either. Deltas of one choice come in order; choices interleave.

    fmt: the endpoint's ChoiceFormat. n: samples per prompt. prompt_tokens: the prompts' tokens, all
    of them (usage). origin_runs: makes a choice's OriginRuns when the request asks for origins
    (return_origins), else None.
    """

    def __init__(self, fmt: ChoiceFormat, n: int, prompt_tokens: int,
                 origin_runs: Optional[Callable[[], OriginRuns]] = None):
        self.fmt, self.n, self.prompt_tokens, self.origin_runs = fmt, n, prompt_tokens, origin_runs
        self.completion_tokens = 0
        self._cached: dict[int, int] = {}  # prompt -> its tokens found in the prefix cache
        self._offset: dict[int, int] = {}  # text so far per choice (completions' text_offset; chat's role once)
        self._runs: dict[int, OriginRuns] = {}
        self._whole: dict[int, dict] = {}

    def index(self, prompt: int, d: StreamDelta) -> int:
        # with a deadline a prompt may answer with fewer than n samples: its choices keep prompt * n + rank
        return prompt * self.n + d.index

    def _see(self, c: int, d: StreamDelta) -> tuple[bool, int]:
        """(the choice's first delta?, its text offset before this one), counting the delta in."""
        first, offset = c not in self._offset, self._offset.get(c, 0)
        self._offset[c] = offset + len(d.text)
        if d.num_cached_tokens is not None:  # a sample's first delta (the n samples share one prompt's KV)
            self._cached[c // self.n] = max(self._cached.get(c // self.n, 0), d.num_cached_tokens)
        self.completion_tokens += len(d.token_ids)
        return first, offset

    def chunk(self, prompt: int, d: StreamDelta) -> Optional[dict]:
        """Streaming: the delta's choice object, or None when it carries nothing a client would see."""
        c = self.index(prompt, d)
        first, offset = self._see(c, d)
        body = self.fmt.delta(c, d, first)
        lp = self.fmt.logprobs(c, d, offset, first)
        extra = self._origins(c, d)  # every delta, sent or not: its tokens move the detokenizer on
        if body or d.finished or lp is not None or extra.get("origins"):
            return {"index": c, self.fmt.delta_key: body, "logprobs": lp, "finish_reason": self.fmt.finish_reason(c, d),
                    "stop_reason": d.stop_reason, **extra}
        return None

    def add(self, prompt: int, d: StreamDelta) -> None:
        """Not streaming: fold the delta into its whole choice."""
        c = self.index(prompt, d)
        first, offset = self._see(c, d)
        ch = self._whole.get(c)
        if ch is None:
            ch = self._whole[c] = {"index": c, self.fmt.message_key: self.fmt.start(c), "logprobs": None,
                                   "finish_reason": None, "stop_reason": None}
        self.fmt.extend(c, ch, d, self.fmt.logprobs(c, d, offset, first))
        if d.finished:
            ch["finish_reason"], ch["stop_reason"] = self.fmt.finish_reason(c, d), d.stop_reason

    def choices(self) -> list[dict]:
        """The whole choices by index (samples finish in any order)."""
        return [self._whole[i] for i in sorted(self._whole)]

    def usage(self) -> dict:
        """OpenAI's usage, prompt_tokens_details.cached_tokens the prompts' tokens the prefix cache held."""
        done = self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": done, "total_tokens": self.prompt_tokens + done,
                "prompt_tokens_details": {"cached_tokens": sum(self._cached.values())}}

    def _origins(self, c: int, d: StreamDelta) -> dict:
        """A streamed choice's new tokens' origins and their text in runs of one origin, when asked; else {}."""
        if self.origin_runs is None or d.origins is None:
            return {}
        stream = self._runs.get(c)
        if stream is None:
            stream = self._runs[c] = self.origin_runs()
        return {"origins": list(d.origins),
                "origin_runs": [[t, o.value] for t, o in stream.push(d.token_ids, d.origins)]}
