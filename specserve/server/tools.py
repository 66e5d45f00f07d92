"""Tool calls on /v1/chat/completions (OpenAI's `tools` and `tool_choice`), as vLLM serves them.

* "auto" (the default once tools are given): the chat template lists the tools and the model writes
  its calls in its own format. Hermes-style blocks, `<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>` (Qwen2.5, Hermes, and the models trained on their data), are parsed out of the text
  (vLLM's hermes parser), and so is an answer that is nothing but call objects naming the given tools,
  untagged (llama.cpp's parser reads those too; Qwen2.5-Coder-0.5B writes its calls so). If any block
  is not such a call, the whole text stays the content.
* "required": the answer is guided (guided generation's JSON Schema) to a list of one or more calls,
  [{"name": one of the tools, "arguments": its parameters}], whatever the model.
* a named function, {"type": "function", "function": {"name": ...}}: the answer is guided to that
  function's parameters, and it is the one call's arguments.
* "none": the template still lists the tools (vLLM's default; OpenAI's model sees them too), and no
  call is parsed: the answer is content.

A ToolStream turns one choice's text, delta by delta, into what the client sees: content that cannot
be part of a call, and the calls, streamed in OpenAI's chunk form (an entry with index, id, type, name
and arguments, then entries with arguments only). The streamed and the whole answer are the same.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Optional

START, END = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolMode:
    """How a request's answer relates to its tools: kind "auto", "required" or "named" (name: the function)."""
    kind: str
    name: Optional[str] = None
    parallel: bool = True  # parallel_tool_calls: False keeps a single call
    names: tuple[str, ...] = ()  # the tools' names (an untagged call must name one)


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call(name: str, arguments) -> Optional[tuple[str, str]]:
    """(name, arguments as JSON text), or None if these are not a call's."""
    if not isinstance(name, str) or not name:
        return None
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    return name, json.dumps(arguments, ensure_ascii=False)


_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_FENCE = re.compile(r"```(?:json|xml)?[ \t]*\n")  # a bare call may come in a fenced block, as llama.cpp reads it
_BARE_START = re.compile(r"(```(?:json|xml)?\s*)?\{")
_BARE_PREFIX = re.compile(r"`{1,3}(?:j(?:s(?:on?)?)?|x(?:ml?)?)?\s*")


def _block_call(body: str) -> Optional[tuple[str, str]]:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    return _call(obj.get("name"), obj.get("arguments", obj.get("parameters"))) if isinstance(obj, dict) else None


def _bare_calls(text: str, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """Calls written without tags (small models drop them): the whole answer one or more JSON objects
    {"name": a tool's name, "arguments": ...}, maybe in a ```json block; [] for anything else."""
    s = text.strip()
    fenced = _FENCE.match(s)
    if fenced:
        if not s.endswith("```"):
            return []
        s = s[fenced.end():-3].strip()
    calls, at, dec = [], 0, json.JSONDecoder()
    while at < len(s):
        try:
            obj, at = dec.raw_decode(s, at)
        except json.JSONDecodeError:
            return []
        call = _call(obj.get("name"), obj.get("arguments", obj.get("parameters"))) if isinstance(obj, dict) else None
        if call is None or call[0] not in names:
            return []
        calls.append(call)
        while at < len(s) and s[at] in " \t\r\n,":
            at += 1
    return calls


def parse_hermes(text: str, names: tuple[str, ...] = ()) -> tuple[str, list[tuple[str, str]]]:
    """(the text before the first call, [(name, arguments JSON)]) for text holding calls; (text, []) if
    it holds none, or if any block is not a JSON object with a name (then no call is made from it).

    Calls are <tool_call> blocks (a last one left open counts if its JSON is complete; text between and
    after the blocks is dropped, as vLLM's parser does), or, as llama.cpp also reads them, an answer
    that is nothing but call objects naming the given tools (`names`)."""
    first = text.find(START)
    if first < 0:
        calls = _bare_calls(text, names)
        return ("", calls) if calls else (text, [])
    calls = []
    for closed, left_open in _BLOCK.findall(text):
        call = _block_call(closed or left_open)
        if call is None:
            return text, []
        calls.append(call)
    return text[:first], calls


def parse_required(text: str) -> list[tuple[str, str]]:
    """The calls of a "required" answer (a JSON list of {"name", "arguments"}); [] if it is not one
    (it was cut short by max_tokens)."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        return []
    if not isinstance(items, list):
        return []
    calls = [_call(i.get("name"), i.get("arguments")) if isinstance(i, dict) else None for i in items]
    return [] if None in calls else calls


def parameters(tool: dict) -> dict:
    """A function's parameters schema (a function that takes none: an empty object)."""
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def required_schema(tools: list[dict], parallel: bool) -> dict:
    """The JSON Schema a "required" answer is guided by: a list of calls of the given functions."""
    one_of = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
               "properties": {"name": {"const": t["function"]["name"]}, "arguments": parameters(t)}} for t in tools]
    return {"type": "array", "minItems": 1, **({} if parallel else {"maxItems": 1}),
            "items": one_of[0] if len(one_of) == 1 else {"anyOf": one_of}}


class ToolStream:
    """One choice's text, delta by delta, as content and tool calls (see the module's docstring)."""

    def __init__(self, mode: ToolMode):
        self.mode = mode
        self.text, self.sent = "", 0  # the answer so far; how much of it went out as content
        self.called = False
        self.bare = True  # "auto": the answer may yet be an untagged call (held back until it cannot be)

    def push(self, text: str, finished: bool) -> tuple[str, list[dict]]:
        """(content to send now, call entries to send now) for the next delta of the answer."""
        self.text += text
        kind = self.mode.kind
        if kind == "named":
            calls = []
            if not self.called:  # the call's opening entry goes out with the first delta, arguments or not
                self.called = True
                calls.append({"index": 0, "id": call_id(), "type": "function",
                              "function": {"name": self.mode.name, "arguments": text}})
            elif text:
                calls.append({"index": 0, "function": {"arguments": text}})
            return "", calls
        if not finished:
            if kind == "required":
                return "", []
            return self._content(self._safe_end()), []
        found = parse_required(self.text) if kind == "required" else parse_hermes(self.text, self.mode.names)[1]
        if not self.mode.parallel:
            found = found[:1]
        if not found:  # no call after all: the held-back text is content
            return self._content(len(self.text)), []
        self.called = True
        before = "" if kind == "required" or START not in self.text else self._content(self.text.find(START))
        return before, [{"index": i, "id": call_id(), "type": "function", "function": {"name": n, "arguments": a}}
                        for i, (n, a) in enumerate(found)]

    def finish_reason(self, reason: Optional[str]) -> Optional[str]:
        """OpenAI's "tool_calls" for an answer that ended in calls it chose to make ("stop" for a named one)."""
        return "tool_calls" if self.called and reason == "stop" and self.mode.kind != "named" else reason

    def _safe_end(self) -> int:
        """How far the text can go out as content: none while it may be an untagged call; else up to a
        <tool_call> seen, or short of a tail that may begin one."""
        if self.bare:
            head = self.text.lstrip()
            if not head or _BARE_START.match(head) or _BARE_PREFIX.fullmatch(head):
                return 0
            self.bare = False
        at = self.text.find(START, max(0, self.sent - len(START)))
        if at >= 0:
            return at
        for k in range(min(len(START) - 1, len(self.text)), 0, -1):
            if START.startswith(self.text[-k:]):
                return len(self.text) - k
        return len(self.text)

    def _content(self, end: int) -> str:
        out = self.text[self.sent:max(end, self.sent)]
        self.sent = max(end, self.sent)
        return out


def merge_calls(message: dict, entries: list[dict]) -> None:
    """Fold streamed call entries into a whole message's tool_calls (which carry no index)."""
    calls = message.setdefault("tool_calls", [])
    for e in entries:
        if "id" in e:
            calls.append({"id": e["id"], "type": e["type"], "function": dict(e["function"])})
        else:
            calls[e["index"]]["function"]["arguments"] += e["function"]["arguments"]
