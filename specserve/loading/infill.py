"""Fill-in-the-middle (FIM): a code model writes what goes between a prefix and a suffix.

Code models trained for it (Qwen2.5-Coder, StarCoder, DeepSeek-Coder, CodeLlama, Granite) read

    [FIM_PRE] prefix [FIM_SUF] suffix [FIM_MID]

and write the middle, ending it with an end-of-generation token (Qwen2.5-Coder: <|endoftext|>). The
three ids come from the GGUF header (`tokenizer.ggml.fim_pre_token_id`, or the older
`tokenizer.ggml.prefix_token_id` names) or, where it names none, from the vocabulary by their text:
llama.cpp's rule (llama-vocab.cpp), which finds Qwen2.5-Coder's since its GGUF files name none. The
layout is the one llama-cpp-python's `create_completion(suffix=...)` and ollama's Qwen2.5-Coder
template build. The code goes in as plain text (Tokenizer.encode_text): a file that spells
"<|endoftext|>" is its characters, as llama.cpp tokenises prefix and suffix.

FIM_PAD, FIM_REP and FIM_SEP end a generation, as in llama.cpp: a model that has written its middle
may go on into the next "file" with them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# The token texts llama.cpp looks for where the header names no id, by role.
TEXTS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}
# GGUF header keys by role: the current names, then the older ones of the first three.
KEYS = {role: (f"tokenizer.ggml.fim_{role}_token_id",) for role in TEXTS}
KEYS["pre"] += ("tokenizer.ggml.prefix_token_id",)
KEYS["suf"] += ("tokenizer.ggml.suffix_token_id",)
KEYS["mid"] += ("tokenizer.ggml.middle_token_id",)


@dataclass(frozen=True)
class FimTokens:
    pre: Optional[int] = None
    suf: Optional[int] = None
    mid: Optional[int] = None
    pad: Optional[int] = None
    rep: Optional[int] = None
    sep: Optional[int] = None

    @property
    def can_infill(self) -> bool:
        return None not in (self.pre, self.suf, self.mid)

    def missing(self) -> list[str]:
        return [role for role in ("pre", "suf", "mid") if getattr(self, role) is None]

    def require(self) -> None:
        """ValueError (one line) for a model that cannot fill in the middle."""
        if not self.can_infill:
            raise ValueError(f"this model has no fill-in-the-middle tokens (no FIM {', '.join(self.missing())} token "
                             f"in its vocabulary), so it cannot take a suffix")

    def ends(self) -> list[int]:
        """The ids that end a generation besides EOS (llama.cpp's end-of-generation set)."""
        return [i for i in (self.pad, self.rep, self.sep) if i is not None]


def find_fim_tokens(vocab: dict[str, int], fields: Optional[dict] = None) -> FimTokens:
    """Each role's id: the header's where it names one, else the first of llama.cpp's texts in `vocab`
    (token text -> id)."""
    fields = fields or {}
    found = {}
    for role, texts in TEXTS.items():
        named = next((fields[k] for k in KEYS[role] if fields.get(k) is not None), None)
        found[role] = int(named) if named is not None else next((vocab[t] for t in texts if t in vocab), None)
    return FimTokens(**found)


def frame(fim: FimTokens, prefix: list[int], suffix: list[int], bos: Optional[int] = None) -> list[int]:
    """[BOS] [FIM_PRE] prefix [FIM_SUF] suffix [FIM_MID]: the prompt whose continuation is the middle
    (llama-cpp-python's and ollama's layout; llama.cpp's /infill puts the repository's other files
    before it, server/routes/infill.py)."""
    fim.require()
    return ([bos] if bos is not None else []) + [fim.pre] + prefix + [fim.suf] + suffix + [fim.mid]
