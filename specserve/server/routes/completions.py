"""/v1/completions: prompts (one or a list, text or token ids) completed; its choices carry "text"
and OpenAI's legacy logprobs (tokens, token_logprobs, top_logprobs, text_offset), the prompt's first
with echo."""
from __future__ import annotations

import itertools
import time
import uuid
from typing import AsyncIterator, Callable, Optional

from fastapi import APIRouter, Request

from ...types import StreamDelta
from ..choices import json_logprob
from ..errors import ApiError
from ..protocol import CompletionRequest
from ..serving import Serving


class CompletionChoice:
    """The ChoiceFormat (server/choices.py) of /v1/completions: the body is the text, streamed or whole."""

    delta_key = message_key = "text"

    def __init__(self, token_text: Callable[[int], str]):
        self.token_text = token_text

    def delta(self, c: int, d: StreamDelta, first: bool) -> str:
        return d.text

    def logprobs(self, d: StreamDelta, offset: int) -> Optional[dict]:
        if d.logprobs is None:
            return None
        toks = [self.token_text(t) for t in d.token_ids]
        offsets, o = [], offset
        for t in toks:
            offsets.append(o)
            o += len(t)
        tops = [{self.token_text(i): json_logprob(lp) for i, lp in top.items()} for top in d.top_logprobs] if d.top_logprobs else None
        return {"tokens": toks, "token_logprobs": [json_logprob(x) for x in d.logprobs], "top_logprobs": tops, "text_offset": offsets}

    def start(self) -> str:
        return ""

    def finish_reason(self, c: int, d: StreamDelta) -> Optional[str]:
        return d.finish_reason

    def extend(self, c: int, choice: dict, d: StreamDelta, lp: Optional[dict]) -> None:
        if lp is not None:
            if choice["logprobs"] is None:
                choice["logprobs"] = {"tokens": [], "token_logprobs": [], "top_logprobs": [] if lp["top_logprobs"] is not None
                                      else None, "text_offset": []}
            for k in ("tokens", "token_logprobs", "text_offset"):
                choice["logprobs"][k] += lp[k]
            if lp["top_logprobs"] is not None:  # None so far where the choice's first delta had no tokens
                choice["logprobs"]["top_logprobs"] = (choice["logprobs"]["top_logprobs"] or []) + lp["top_logprobs"]
        choice["text"] += d.text


class Echo:
    """echo: each choice's text, and its logprobs where asked, start with its prompt's, as in OpenAI's
    legacy completions and vLLM (what lm-evaluation-harness scores log-likelihoods with). The prompt as
    sent (a list of ids: their text, special tokens kept); its tokens' log-probabilities under the model,
    the first None (SamplingParams.prompt_logprobs, on each sample's first delta). Text offsets run over
    the tokens' texts, prompt then completion (the echoed text where the prompt's tokens spell it: a BOS
    token's text is in the tokens, not in a prompt string)."""

    def __init__(self, prompts: list, ids: list[list[int]], token_text: Callable[[int], str], decode: Callable[[list[int]], str]):
        self.texts = [p if isinstance(p, str) else decode(p) for p in prompts]
        self.ids, self.token_text = ids, token_text
        self.scored: dict[tuple[int, int], StreamDelta] = {}  # (prompt, sample) -> its delta with the prompt's scores

    def watch(self, i: int, stream: AsyncIterator[StreamDelta]) -> AsyncIterator[StreamDelta]:
        """Prompt i's stream, its prompt scores kept on the way; closing it closes the engine's (an abort)."""
        async def watched():
            try:
                async for d in stream:
                    if d.prompt_logprobs is not None:
                        self.scored[(i, d.index)] = d
                    yield d
            finally:
                await stream.aclose()
        return watched()

    def apply(self, response: dict, n: int) -> dict:
        for ch in response["choices"]:
            i = ch["index"] // n
            text, lp, d = self.texts[i], ch["logprobs"], self.scored.get((i, ch["index"] % n))
            ch["text"] = text + ch["text"]
            if lp is None or d is None:
                continue
            toks = [self.token_text(t) for t in self.ids[i]]
            offsets = [0, *itertools.accumulate(len(t) for t in toks)]  # offsets[-1]: the prompt tokens' text
            tops = None if lp["top_logprobs"] is None else [
                None if top is None else {self.token_text(t): v for t, v in top.items()} for top in d.prompt_top_logprobs]
            ch["logprobs"] = {"tokens": toks + lp["tokens"], "token_logprobs": list(d.prompt_logprobs) + lp["token_logprobs"],
                              "top_logprobs": None if tops is None else tops + lp["top_logprobs"],
                              "text_offset": offsets[:-1] + [o + offsets[-1] for o in lp["text_offset"]]}
        return response


def router(s: Serving) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request):
        s.check_common(body)
        prompts = body.prompts()
        if not 1 <= len(prompts) <= s.cfg.max_prompts:
            raise ApiError(400, f"prompt must hold 1 to {s.cfg.max_prompts} prompts", param="prompt")
        slot, ids, params = await s.admit_and_prepare(body, prompts)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        streams = [s.engine(body).generate(p, params) for p in ids]
        echo = None
        if body.echo:
            shown = prompts if body.truncate_prompt_tokens is None else ids  # a truncated prompt: what was served
            echo = Echo(shown, ids, s.token_text(body), lambda p: s.engine(body).tokenizer.decode(p, skip_special_tokens=False))
            streams = [echo.watch(i, st) for i, st in enumerate(streams)]
        choices = s.new_choices(body, CompletionChoice(s.token_text(body)), params.n, ids)  # prompt i's sample k: choice i * n + k
        head = {"id": rid, "object": "text_completion", "created": created, "model": s.name(body)}
        out = await s.respond(http, slot, body, streams, choices, head, "text_completion")
        return echo.apply(out, params.n) if echo is not None and isinstance(out, dict) else out

    return r
