"""Tokenizer: a `tokenizers.Tokenizer` plus the chat template and the special ids the engine needs.

Built either from GGUF metadata (its vocabulary made a backend in gguf_vocab.py) or from a Hugging Face
tokenizer.json.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import threading
from typing import Optional, Sequence

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from . import chat_templates, gguf_vocab, infill
from .infill import FimTokens, find_fim_tokens

_PLAIN_LOCK = threading.Lock()  # one build of a tokenizer's plain-text copy (Tokenizer.encode_text) at a time


def read_chat_template(value: str) -> str:
    """A chat template given as a file's path or as the template's text (vLLM's --chat-template: text
    with Jinja's braces or a newline is the template itself)."""
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as f:
                value = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"chat_template: cannot read {value}: {getattr(e, 'strerror', None) or e}") from None
    elif not any(c in value for c in "{}\n"):
        raise ValueError(f"chat_template: {value}: no such file, and not a template (no Jinja braces)")
    check_chat_template(value)
    return value


def check_chat_template(template: str) -> None:
    """ValueError in one line where Jinja cannot parse the template."""
    try:
        ImmutableSandboxedEnvironment().parse(template)
    except jinja2.TemplateError as e:
        raise ValueError(f"chat_template: not a Jinja template: {str(e).splitlines()[0]}") from None


def open_final_message(text: str, final: Optional[str]) -> str:
    """A rendered conversation cut after its last message's content, as HF's apply_chat_template does
    for continue_final_message: at the content's last occurrence, its trailing space kept where the
    template kept it."""
    if not isinstance(final, str) or not final.strip() or final.strip() not in text:
        raise ValueError("continue_final_message: the last message needs text content that the chat template renders")
    at = text.rindex(final.strip())
    whole = len(final.lstrip())  # HF's test: the template kept the message as written, trailing space and all
    return text[:at + whole] if text[at:at + whole] == final else text[:at + len(final.strip())]


class Tokenizer:
    def __init__(self, backend: HFTokenizer, eos_token_ids: Sequence[int], bos_token_id: Optional[int],
                 add_bos: bool, chat_template: Optional[str], special_tokens: dict[str, str],
                 fim: Optional[FimTokens] = None):
        self.backend = backend
        self.eos_token_ids = list(eos_token_ids)
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.special_tokens = special_tokens  # e.g. {"bos_token": "<|im_start|>", "eos_token": ...}
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        # fill-in-the-middle ids (loading/infill.py): found in the vocabulary unless given
        self.fim = fim if fim is not None else find_fim_tokens(backend.get_vocab(with_added_tokens=True))
        self._compiled: Optional[tuple[str, jinja2.Template]] = None  # (the template, compiled)
        self._takes_tools: Optional[tuple[str, bool]] = None  # (the template, whether it reads tools)
        self._plain: Optional[HFTokenizer] = None  # the backend with special tokens' spellings as text (encode_text)

    def __getstate__(self):  # a Ray replica sends its tokenizer pickled: the compiled template and the
        return {**self.__dict__, "_compiled": None, "_plain": None}  # plain-text copy stay behind

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def from_gguf_fields(cls, fields: dict, path: str) -> "Tokenizer":
        kind = fields.get("tokenizer.ggml.model")
        if kind not in ("gpt2", "llama"):
            raise ValueError(f"{path}: tokenizer type {kind!r} is not supported (supported: 'gpt2' byte-level BPE, "
                             f"'llama' SentencePiece)")
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        types = fields.get("tokenizer.ggml.token_type") or [gguf_vocab.TOKEN_TYPE_NORMAL] * len(tokens)
        backend = gguf_vocab.backend(fields, tokens, types, path)
        eos = fields.get("tokenizer.ggml.eos_token_id")
        fim = find_fim_tokens({t: i for i, t in enumerate(tokens)}, fields)
        eos_ids = gguf_vocab.end_of_generation(tokens, types, (eos, fields.get("tokenizer.ggml.eot_token_id")), fim)
        bos = fields.get("tokenizer.ggml.bos_token_id")
        add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", False))
        special = {}
        if bos is not None:
            special["bos_token"] = tokens[bos]
        if eos is not None:
            special["eos_token"] = tokens[eos]
        template = fields.get("tokenizer.chat_template") or chat_templates.BUILTIN.get(fields.get("general.architecture"))
        return cls(backend, eos_ids, bos, add_bos, template, special, fim)

    @classmethod
    def from_hf_dir(cls, path: str, eos_token_ids: Sequence[int], bos_token_id: Optional[int]) -> "Tokenizer":
        tok_file = os.path.join(path, "tokenizer.json")
        if not os.path.exists(tok_file):
            raise ValueError(f"{path}: no tokenizer.json (a Hugging Face directory needs one)")
        backend = HFTokenizer.from_file(tok_file)
        cfg_file = os.path.join(path, "tokenizer_config.json")
        cfg = json.load(open(cfg_file)) if os.path.exists(cfg_file) else {}

        def token_str(v):
            return v.get("content") if isinstance(v, dict) else v

        special = {k: token_str(cfg[k]) for k in ("bos_token", "eos_token") if cfg.get(k)}
        eos_ids = list(eos_token_ids)
        if "eos_token" in special and backend.token_to_id(special["eos_token"]) is not None:
            eid = backend.token_to_id(special["eos_token"])
            if eid not in eos_ids:
                eos_ids.append(eid)
        if bos_token_id is None and "bos_token" in special:
            bos_token_id = backend.token_to_id(special["bos_token"])
        # A code model's middle ends on FIM's pad, repo and file separators too (llama.cpp's rule; HF's
        # generation configs name <|endoftext|> for Qwen2.5-Coder but not these).
        fim = find_fim_tokens(backend.get_vocab(with_added_tokens=True))
        if fim.can_infill:
            eos_ids += [i for i in fim.ends() if i not in eos_ids]
        # A tokenizer.json whose post-processor adds BOS already does it in encode().
        add_bos = bool(cfg.get("add_bos_token", False)) and backend.post_processor is None
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return cls(backend, eos_ids, bos_token_id, add_bos, template, special, fim)

    def fingerprint(self) -> str:
        """SHA-256 of the vocabulary (token -> id): two tokenizers with the same fingerprint agree on ids."""
        vocab = sorted(self.backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        return hashlib.sha256("\n".join(f"{i}\t{t}" for t, i in vocab).encode()).hexdigest()

    # --- use ----------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch of one: the same ids, but it lets go of the GIL while it works (encode holds it,
        # ~2.5 s for 4 MB of text), so a server tokenising in a thread keeps answering meanwhile
        ids = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id] + ids
        return ids

    def encode_text(self, text: str) -> list[int]:
        """text as plain text, no BOS: a special token's spelling in it ("<|endoftext|>" in a source
        file) is its characters, not the token, as llama.cpp tokenises without parse_special. Code and
        documents quoted into a prompt go in this way; encode() reads the spellings as the tokens."""
        if self._plain is None:  # a copy: the flag is the backend's, and other threads encode with it
            with _PLAIN_LOCK:
                if self._plain is None:
                    plain = HFTokenizer.from_str(self.backend.to_str())
                    plain.encode_special_tokens = True
                    self._plain = plain
        return self._plain.encode_batch([text], add_special_tokens=False)[0].ids

    def encode_infill(self, prefix: str, suffix: str) -> list[int]:
        """The fill-in-the-middle prompt of a code model: generating from it writes what goes between
        prefix and suffix (loading/infill.py; ValueError for a model without FIM tokens)."""
        self.fim.require()
        return infill.frame(self.fim, self.encode_text(prefix), self.encode_text(suffix),
                            self.bos_token_id if self.add_bos else None)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: Optional[list[dict]] = None, continue_final_message: bool = False,
                            template_kwargs: Optional[dict] = None) -> str:
        """The conversation as the template renders it, in HF transformers' environment: its tojson
        (no HTML escaping, keys in order), raise_exception and strftime_now. tools: OpenAI's function
        schemas, for a template that lists them (ValueError where it does not read `tools`).
        continue_final_message (HF's and vLLM's): the text ends where the last message's content does,
        its end-of-turn left off, so the model continues that message (an assistant's prefill).
        template_kwargs (vLLM's chat_template_kwargs): more variables for the template (Qwen3's
        enable_thinking, ...); the ones above are set by their own arguments."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; use generate() with a plain prompt")
        if tools and not self.takes_tools:
            raise ValueError("this model's chat template takes no tools")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be set: the first continues "
                             "the last message, the second opens a new assistant turn")
        taken = {"messages", "tools", "add_generation_prompt", "continue_final_message"} & set(template_kwargs or {})
        if taken:
            raise ValueError(f"chat_template_kwargs: {', '.join(sorted(taken))} is set by its own argument, not here")
        text = self._template().render(**{**self.special_tokens, **(template_kwargs or {})}, messages=messages,
                                       add_generation_prompt=add_generation_prompt, tools=tools or None)
        return open_final_message(text, messages[-1].get("content")) if continue_final_message else text

    def set_chat_template(self, template: str) -> None:
        """Use this Jinja template for chats (ValueError in one line where Jinja cannot parse it)."""
        check_chat_template(template)
        self.chat_template = template

    @property
    def takes_tools(self) -> bool:
        """Whether the chat template reads `tools` (Qwen2.5's, Llama 3.1's), as ollama decides a model's
        tool support (False for a template jinja cannot parse: rendering it says why)."""
        if not self.chat_template:
            return False
        if self._takes_tools is None or self._takes_tools[0] != self.chat_template:
            try:
                env = ImmutableSandboxedEnvironment()
                takes = "tools" in jinja2.meta.find_undeclared_variables(env.parse(self.chat_template))
            except jinja2.TemplateError:
                takes = False
            self._takes_tools = (self.chat_template, takes)
        return self._takes_tools[1]

    def _template(self) -> jinja2.Template:
        if self._compiled is None or self._compiled[0] != self.chat_template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined)

            def raise_exception(msg):
                raise jinja2.exceptions.TemplateError(msg)

            def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
                return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

            env.globals.update(raise_exception=raise_exception,
                               strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
            env.filters["tojson"] = tojson
            self._compiled = (self.chat_template, env.from_string(self.chat_template))
        return self._compiled[1]


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without re-decoding everything.

    Decodes a short window (the last few tokens) and holds back text that ends in an incomplete
    UTF-8 sequence, as vLLM's detokenizer does.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.prefix_offset = 0  # window start
        self.read_offset = 0  # tokens whose text has been emitted

    def step(self, ids: Sequence[int]) -> str:
        prefix = self.tokenizer.decode(ids[self.prefix_offset:self.read_offset], self.skip)
        full = self.tokenizer.decode(ids[self.prefix_offset:], self.skip)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(ids)
            return delta
        return ""
