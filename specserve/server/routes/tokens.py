"""/tokenize and /detokenize (vLLM's, at the root as vLLM serves them): what a prompt or a conversation
costs in tokens before sending it, and token ids (from logprobs, a log) back to text. They generate
nothing, so they take no slot in flight; tokenising runs off the event loop, as the generating routes'."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter

from ..errors import ApiError
from ..protocol import DetokenizeRequest, TokenizeRequest
from ..serving import Serving


def router(s: Serving) -> APIRouter:
    r = APIRouter()

    def tokenize(body: TokenizeRequest) -> list[int]:
        if body.messages is None:  # a prompt exactly as /v1/completions tokenises it
            return s.engine(body).encode(body.prompt, body.add_special_tokens)
        return s.encode_messages(body, body.add_generation_prompt)  # a conversation as /v1/chat/completions renders it

    @r.post("/tokenize")
    async def tokenize_route(body: TokenizeRequest):
        """{count, max_model_len, tokens} (and token_strs, each token's text, if return_token_strs)."""
        s.check_model(body)
        if why := body.unsupported():
            raise ApiError(400, why[0], param=why[1])
        ids = await asyncio.to_thread(tokenize, body)
        out = {"count": len(ids), "max_model_len": s.engine(body).max_model_len, "tokens": ids}
        if body.return_token_strs:
            out["token_strs"] = [s.token_text(body)(t) for t in ids]
        return out

    @r.post("/detokenize")
    async def detokenize_route(body: DetokenizeRequest):
        """{prompt}: the ids' text, special tokens included (what the model saw)."""
        s.check_model(body)
        tok = s.engine(body).tokenizer
        bad = next((t for t in body.tokens if not 0 <= t < tok.vocab_size), None)
        if bad is not None:
            raise ApiError(400, f"tokens: {bad} is not a token id of this model (0 .. {tok.vocab_size - 1})", param="tokens")
        text = await asyncio.to_thread(tok.decode, body.tokens, False)
        return {"prompt": text}

    return r
