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

    def check_model(body) -> None:
        if body.model is not None and body.model not in s.models:
            raise s.unknown_model(body.model)

    def tokenize(body: TokenizeRequest) -> list[int]:
        llm = s.engine(body)
        if body.messages is None:  # a prompt exactly as /v1/completions tokenises it
            return llm.encode(body.prompt, body.add_special_tokens)
        try:  # a conversation exactly as /v1/chat/completions renders it
            return llm.encode_chat([{"role": m.role, "content": m.text()} for m in body.messages], body.add_generation_prompt)
        except ValueError as e:
            raise ApiError(400, f"messages: {str(e).splitlines()[0]}", param="messages") from None

    @r.post("/tokenize")
    async def tokenize_route(body: TokenizeRequest):
        """{count, max_model_len, tokens} (and token_strs, each token's text, if return_token_strs)."""
        check_model(body)
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
        check_model(body)
        tok = s.engine(body).tokenizer
        bad = next((t for t in body.tokens if not 0 <= t < tok.vocab_size), None)
        if bad is not None:
            raise ApiError(400, f"tokens: {bad} is not a token id of this model (0 .. {tok.vocab_size - 1})", param="tokens")
        text = await asyncio.to_thread(tok.decode, body.tokens, False)
        return {"prompt": text}

    return r
