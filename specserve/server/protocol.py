"""The OpenAI request bodies the server takes (pydantic), and their mapping onto SamplingParams.

Fields follow OpenAI's API; `top_k`, `min_p`, `repetition_penalty`, `min_tokens`, `allowed_token_ids`,
`include_stop_str_in_output` and `ignore_eos` are extras, as in vLLM. Unknown fields are ignored
(clients send `user` and the like); values this engine cannot honour (OpenAI's deprecated `functions`,
streaming best_of, chat-only parameters on /v1/completions) get a 400 that names the parameter.
"""
from __future__ import annotations

import json
from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..registry import GUIDED
from ..types import MAX_TOP_LOGPROBS, SamplingParams
from .tools import ToolMode, parameters, required_schema


class StreamOptions(BaseModel):
    include_usage: bool = False


# Fields passed to SamplingParams as they are, where set.
SAMPLING_FIELDS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens",
                   "allowed_token_ids", "include_stop_str_in_output", "bad_words", "truncate_prompt_tokens")


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    # max_tokens left out: the rest of the context (chat, as vLLM), or OpenAI's 16 (completions)
    fills_context: ClassVar[bool] = True
    # a length past the context (or the KV cache) is cut to it (llama-server's way) rather than refused (vLLM's)
    clamps_length: ClassVar[bool] = False

    model: Optional[str] = None
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None  # extra (vLLM)
    n: int = 1
    stop: Union[str, list[str], None] = None
    seed: Optional[int] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: bool = False  # extra (vLLM)
    speculative: Optional[bool] = None  # extra: false = never draft for this request (same tokens either way)
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None  # extra (vLLM)
    min_p: Optional[float] = None  # extra (vLLM)
    min_tokens: Optional[int] = None  # extra (vLLM)
    allowed_token_ids: Optional[list[int]] = None  # extra (vLLM)
    include_stop_str_in_output: Optional[bool] = None  # extra (vLLM)
    bad_words: Optional[list[str]] = None  # extra (vLLM)
    truncate_prompt_tokens: Optional[int] = None  # extra (vLLM): keep the prompt's last k tokens (-1: all that fit)
    logit_bias: Optional[dict[str, float]] = None  # {"token id": bias in [-100, 100]}, added to the logits
    # guided generation, extras as in vLLM (the chat endpoint's response_format maps onto these)
    guided_json: Union[dict[str, Any], str, None] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    # n-best: best_of samples (OpenAI's completions field; an extra for chat, as in vLLM), the n of
    # highest mean log-probability answered, best first; best_of_deadline_s (extra, BASS section 4.5):
    # the samples finished within that many seconds
    best_of: Optional[int] = None
    best_of_deadline_s: Optional[float] = None
    # extra: streamed choices carry their new tokens' "origins" (who proposed each: TokenOrigin values,
    # target, draft, lookup, ...) and "origin_runs", [[text, origin], ...] (the playground colours them)
    return_origins: bool = False

    def unsupported(self) -> Optional[tuple[str, str]]:
        """(one-line reason, the parameter) for a value this engine cannot honour, else None."""
        if self.stream_options is not None and not self.stream:  # as OpenAI and vLLM
            return "stream_options is only allowed when stream is true", "stream_options"
        if self.stream and (self.best_of is not None or self.best_of_deadline_s is not None):
            return ("best_of and best_of_deadline_s cannot stream: the answer is chosen once every sample has finished",
                    "best_of" if self.best_of is not None else "best_of_deadline_s")
        return None

    def asked_max_tokens(self) -> Optional[int]:
        return self.max_tokens

    def token_biases(self) -> Optional[dict[int, float]]:
        """logit_bias with token ids for keys (OpenAI sends them as strings)."""
        if self.logit_bias is None:
            return None
        out = {}
        for k, v in self.logit_bias.items():
            try:
                out[int(k)] = v
            except ValueError:
                raise ValueError(f"logit_bias keys must be token ids, got {k!r}") from None
        return out

    def sampling_params(self, default_max_tokens: int, logprobs: Union[bool, int]) -> SamplingParams:
        """ValueError (one line) for values out of range, as SamplingParams validates them."""
        return SamplingParams(
            n=self.n, temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=-1 if self.top_k is None else self.top_k,
            max_tokens=default_max_tokens if self.max_tokens is None else self.max_tokens, seed=self.seed,
            stop=self.stop, ignore_eos=self.ignore_eos, logprobs=logprobs, speculative=self.speculative,
            best_of=self.best_of, best_of_deadline_s=self.best_of_deadline_s, logit_bias=self.token_biases(),
            prompt_logprobs=self.prompt_logprobs_param(), **self.set_fields(SAMPLING_FIELDS), **self.guided())

    def set_fields(self, fields: tuple[str, ...]) -> dict:
        """Those of these fields the body sets (null: SamplingParams' default)."""
        return {k: getattr(self, k) for k in fields if getattr(self, k) is not None}

    def prompt_logprobs_param(self) -> Optional[int]:
        """SamplingParams.prompt_logprobs: scored prompts only where the response shows them (echo)."""
        return None

    def guided(self) -> dict:
        """The guided_<kind> extras set (registry.GUIDED's kinds that have one: json_object comes from
        response_format)."""
        fields = (f"guided_{kind}" for kind in GUIDED.names())
        return {k: getattr(self, k) for k in fields if getattr(self, k, None) is not None}


class CompletionRequest(_Common):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    logprobs: Optional[int] = None  # 0..5 in OpenAI's API (here up to MAX_TOP_LOGPROBS)
    fills_context: ClassVar[bool] = False
    echo: bool = False
    # fill-in-the-middle: the text after the completion; each prompt is the text before it, and a code
    # model with FIM tokens writes what goes between (Tokenizer.encode_infill). "" is the end of a file,
    # still a middle to fill (vLLM refuses any suffix that is not null; ollama's "" is unset)
    suffix: Optional[str] = None
    # chat parameters: not part of /v1/completions, so refused by name rather than ignored as if honoured
    tools: Optional[Any] = None
    functions: Optional[Any] = None
    tool_choice: Optional[Any] = None
    parallel_tool_calls: Optional[Any] = None
    response_format: Optional[Any] = None

    def unsupported(self) -> Optional[tuple[str, str]]:
        if self.suffix is not None and self.echo:
            return "echo is not supported with suffix (the prompt is two texts around the completion)", "echo"
        if self.suffix is not None and self.truncate_prompt_tokens is not None:  # it would cut the FIM tokens off
            return "truncate_prompt_tokens is not supported with suffix", "truncate_prompt_tokens"
        for name in ("tools", "functions", "tool_choice", "parallel_tool_calls"):
            if getattr(self, name) is not None:
                return f"{name} is not supported on /v1/completions", name
        if self.response_format is not None:
            return ("response_format is not supported on /v1/completions (use /v1/chat/completions, or guided_json here)",
                    "response_format")
        return super().unsupported()

    def prompts(self) -> list[Union[str, list[int]]]:
        p = self.prompt
        if isinstance(p, str) or (isinstance(p, list) and p and isinstance(p[0], int)):
            return [p]
        return list(p)

    def prompt_ids(self, llm) -> list[list[int]]:
        """Each prompt's token ids (llm: an AsyncLLM's public surface): as given, or the text tokenised;
        with a suffix, each prompt is the code before the completion, framed with the model's
        fill-in-the-middle tokens (Tokenizer.encode_infill). ValueError "<field>: why"."""
        prompts = self.prompts()
        if self.suffix is None:
            try:
                return [llm.encode(p) for p in prompts]
            except (TypeError, ValueError) as e:
                raise ValueError(f"prompt: {e}") from None
        if not all(isinstance(p, str) for p in prompts):
            raise ValueError("prompt: with suffix, prompts are text (the code before the completion)")
        try:
            return [llm.tokenizer.encode_infill(p, self.suffix) for p in prompts]
        except ValueError as e:
            raise ValueError(f"suffix: {e}") from None

    def prompt_logprobs_param(self) -> Optional[int]:
        return self.logprobs if self.echo else None  # echo with logprobs: the prompt's tokens scored too

    def logprobs_param(self) -> Union[bool, int]:
        if self.logprobs is None:
            return False
        if not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")
        return self.logprobs


class FunctionDef(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's rule (vLLM allows dots too)
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None  # a JSON Schema
    strict: Optional[bool] = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[dict[str, Any]], None] = None
    tool_calls: Optional[list[dict[str, Any]]] = None  # an assistant's calls, as a response gave them
    tool_call_id: Optional[str] = None  # a tool message: the call it answers
    name: Optional[str] = None

    def template_dict(self) -> dict:
        """The message as chat templates read it: a call's arguments as an object, not OpenAI's JSON
        text (Qwen2.5's template writes them with tojson), as vLLM passes them."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls is not None:
            calls = []
            for c in self.tool_calls:
                fn = c.get("function")
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise ValueError('an assistant\'s tool_calls need {"function": {"name", "arguments"}}')
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except json.JSONDecodeError:
                        raise ValueError(f"the arguments of a call to {fn['name']} are not JSON") from None
                calls.append({**c, "function": {**fn, "arguments": args}})
            out["tool_calls"] = calls
        for key in ("tool_call_id", "name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:  # [{"type": "text", "text": ...}]: text parts only
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


def prefill_conflict(body) -> Optional[tuple[str, str]]:
    """continue_final_message with add_generation_prompt (its default, true): refused, as vLLM does."""
    if body.continue_final_message and body.add_generation_prompt:
        return ("continue_final_message needs add_generation_prompt false: the first continues the last message, "
                "the second opens a new assistant turn"), "continue_final_message"
    return None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: Optional[bool] = None
    functions: Optional[Any] = None  # OpenAI's deprecated form of tools
    function_call: Optional[Any] = None
    response_format: Optional[dict[str, Any]] = None
    # extras (vLLM's): the template's generation prompt, or the last message continued (a prefill)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None  # more variables for the template (Qwen3's enable_thinking)

    def unsupported(self) -> Optional[tuple[str, str]]:
        if why := prefill_conflict(self):
            return why
        for name in ("functions", "function_call"):
            if getattr(self, name) is not None:
                return f"{name} is not supported (OpenAI's deprecated form: use tools and tool_choice)", name
        if not self.tools and self.tool_choice not in (None, "none", "auto"):  # without tools both mean no call
            return "tool_choice \"required\" or a named function needs tools", "tool_choice"
        mode = self.tool_mode()
        if mode is not None and mode.kind == "named" and mode.name not in {t.function.name for t in self.tools}:
            return f"tool_choice names the function {mode.name!r}, which is not among the tools", "tool_choice"
        if mode is not None and mode.kind != "auto" and (super().guided() or (self.response_format or {}).get("type", "text") != "text"):
            return ("tool_choice \"required\" or a named function guides the answer to the call: it cannot be "
                    "combined with response_format or guided_*"), "tool_choice"
        if self.response_format and self.response_format.get("type", "text") not in ("text", "json_object", "json_schema"):
            return (f"response_format type {self.response_format.get('type')!r} is not supported (text, json_object, json_schema)",
                    "response_format")
        return super().unsupported()

    def asked_max_tokens(self) -> Optional[int]:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    def tool_mode(self) -> Optional[ToolMode]:
        """How the answer relates to the tools (server/tools.py); None without tools or with tool_choice "none"."""
        if not self.tools or self.tool_choice == "none":
            return None
        parallel, names = self.parallel_tool_calls is not False, tuple(t.function.name for t in self.tools)
        if isinstance(self.tool_choice, NamedToolChoice):
            return ToolMode("named", self.tool_choice.function.name, parallel, names)
        return ToolMode(self.tool_choice or "auto", None, parallel, names)

    def template_tools(self) -> Optional[list[dict]]:
        """The tools for the chat template to list (as the client sent them), with tool_choice "none"
        too: the model sees them and calls none, as in OpenAI's API and vLLM's default."""
        return [t.model_dump(exclude_unset=True) for t in self.tools] if self.tools else None

    def guided(self) -> dict:
        """response_format {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}
        as SamplingParams' guided fields (beside the vLLM extras); tool_choice "required" or a named
        function as the JSON Schema of the call(s)."""
        mode = self.tool_mode()
        if mode is not None and mode.kind == "required":
            return {"guided_json": required_schema(self.template_tools(), mode.parallel)}
        if mode is not None and mode.kind == "named":
            return {"guided_json": parameters(next(t for t in self.template_tools() if t["function"]["name"] == mode.name))}
        out = super().guided()
        kind = (self.response_format or {}).get("type", "text")
        if kind == "json_object":
            out["guided_json_object"] = True
        elif kind == "json_schema":
            spec = self.response_format.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise ValueError('response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}')
            out["guided_json"] = spec["schema"]
        return out

    def logprobs_param(self) -> Union[bool, int]:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if not self.logprobs:
            return False
        k = self.top_logprobs or 0
        if not 0 <= k <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {k}")
        return k

    def sampling_params(self, default_max_tokens: int, logprobs: Union[bool, int]) -> SamplingParams:
        if self.max_completion_tokens is not None and self.max_tokens is None:
            self.max_tokens = self.max_completion_tokens
        return super().sampling_params(default_max_tokens, logprobs)


class TokenizeRequest(BaseModel):
    """/tokenize (vLLM's): a prompt, or a conversation rendered by the model's chat template, as the
    token ids the generating endpoints would feed the model."""
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = Field(default=None, min_length=1)
    add_special_tokens: bool = True  # a prompt's BOS where the model adds one (a conversation's come from its template)
    add_generation_prompt: bool = True  # the assistant's turn opened, as /v1/chat/completions does
    continue_final_message: bool = False  # the last message left open, as /v1/chat/completions would
    chat_template_kwargs: Optional[dict[str, Any]] = None
    return_token_strs: bool = False
    tools: Optional[list[Tool]] = None  # listed by the template, as /v1/chat/completions would

    def template_tools(self) -> Optional[list[dict]]:
        return [t.model_dump(exclude_unset=True) for t in self.tools] if self.tools else None

    def unsupported(self) -> Optional[tuple[str, str]]:
        if (self.prompt is None) == (self.messages is None):
            return "give either prompt or messages", "prompt" if self.prompt is None else "messages"
        if self.tools and self.messages is None:
            return "tools are listed by a conversation's chat template: give messages, not prompt", "tools"
        if why := prefill_conflict(self):
            return why
        return None


class DetokenizeRequest(BaseModel):
    """/detokenize (vLLM's): token ids back to text, special tokens kept."""
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    tokens: list[int]


def error_body(message: str, type_: str, code: Optional[Union[int, str]] = None, param: Optional[str] = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
