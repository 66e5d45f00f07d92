"""/v1/completions: prompts (one or a list, text or token ids) completed; its choices carry "text"
and OpenAI's legacy logprobs (tokens, token_logprobs, top_logprobs, text_offset), the prompt's first
with echo."""
from __future__ import annotations

import itertools
import time
import uuid
from typing import Callable, Optional

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

    def logprobs(self, c: int, d: StreamDelta, offset: int, first: bool) -> Optional[dict]:
        if d.logprobs is None:
            return None
        toks = [self.token_text(t) for t in d.token_ids]
        offsets, o = [], offset
        for t in toks:
            offsets.append(o)
            o += len(t)
        tops = [{self.token_text(i): json_logprob(lp) for i, lp in top.items()} for top in d.top_logprobs] if d.top_logprobs else None
        return {"tokens": toks, "token_logprobs": [json_logprob(x) for x in d.logprobs], "top_logprobs": tops, "text_offset": offsets}

    def start(self, c: int) -> str:
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


class EchoedChoice(CompletionChoice):
    """echo: each choice's text, and its logprobs where asked, start with its prompt's, streamed or
    whole, as in OpenAI's legacy completions and vLLM (what lm-evaluation-harness scores
    log-likelihoods with). The prompt's text: as sent (a list of ids, or a truncated prompt: the ids'
    text, special tokens kept). Its tokens' log-probabilities under the model, the first None, come on
    each sample's first delta (SamplingParams.prompt_logprobs). Text offsets run over the tokens' texts,
    prompt then completion (a BOS token's text is in the tokens, not in a prompt string)."""

    def __init__(self, token_text: Callable[[int], str], texts: list[str], ids: list[list[int]], n: int):
        super().__init__(token_text)
        self.texts, self.ids, self.n = texts, ids, n
        self.prompt_chars = [sum(len(token_text(t)) for t in p) for p in ids]  # where the completion's offsets start

    def delta(self, c: int, d: StreamDelta, first: bool) -> str:
        return self.texts[c // self.n] + d.text if first else d.text

    def start(self, c: int) -> str:
        return self.texts[c // self.n]

    def logprobs(self, c: int, d: StreamDelta, offset: int, first: bool) -> Optional[dict]:
        i = c // self.n
        lp = super().logprobs(c, d, offset + self.prompt_chars[i], first)
        if not first or d.prompt_logprobs is None:  # scores come with logprobs asked, on the first delta
            return lp
        lp = lp or {"tokens": [], "token_logprobs": [], "top_logprobs": None, "text_offset": []}  # a delta of no tokens
        toks = [self.token_text(t) for t in self.ids[i]]
        offsets = list(itertools.accumulate((len(t) for t in toks[:-1]), initial=0))
        # a sample stopped by best_of_deadline_s before its prompt was scored: the rest of its scores None
        scores = [None if x is None else json_logprob(x) for x in d.prompt_logprobs]
        scores += [None] * (len(toks) - len(scores))
        tops = None  # logprobs=0: no alternatives (prompt_top_logprobs None, the completion's None)
        if d.prompt_top_logprobs or lp["top_logprobs"] is not None:
            tops = [None if top is None else {self.token_text(t): json_logprob(v) for t, v in top.items()}
                    for top in d.prompt_top_logprobs or []]
            tops += [None] * (len(toks) - len(tops))
            tops += lp["top_logprobs"] or []
        return {"tokens": toks + lp["tokens"], "token_logprobs": scores + lp["token_logprobs"], "top_logprobs": tops,
                "text_offset": offsets + lp["text_offset"]}


def router(s: Serving) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request):
        s.check_common(body)
        prompts = body.prompts()
        if not 1 <= len(prompts) <= s.cfg.max_prompts:
            raise ApiError(400, f"prompt must hold 1 to {s.cfg.max_prompts} prompts", param="prompt")
        slot, ids, params = await s.admit_and_prepare(body)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        streams = [s.engine(body).generate(p, params) for p in ids]
        fmt = CompletionChoice(s.token_text(body))
        if body.echo:
            decode = s.engine(body).tokenizer.decode
            shown = prompts if body.truncate_prompt_tokens is None else ids  # a truncated prompt: what was served
            texts = [p if isinstance(p, str) else decode(p, skip_special_tokens=False) for p in shown]
            fmt = EchoedChoice(s.token_text(body), texts, ids, params.n)
        choices = s.new_choices(body, fmt, params.n, ids)  # prompt i's sample k: choice i * n + k
        head = {"id": rid, "object": "text_completion", "created": created, "model": s.name(body)}
        return await s.respond(http, slot, body, streams, choices, head, "text_completion")

    return r
