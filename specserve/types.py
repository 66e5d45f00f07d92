"""The data that flows through the engine: sampling parameters, the request, and what comes out.

Plain Python (no torch), so the scheduler and block manager that use it unit-test in milliseconds.
"""
from __future__ import annotations

import enum
import math
import numbers
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from .options import option
from .registry import GUIDED

if TYPE_CHECKING:
    import torch


MAX_SEED = 2**63 - 1  # torch generators take 64-bit seeds; beyond, Python ints overflow them
MAX_TOP_LOGPROBS = 20  # vLLM's default max_logprobs; the OpenAI API allows 20 top_logprobs too


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def truncate_prompt(prompt_token_ids: list[int], keep: Optional[int], max_model_len: int) -> list[int]:
    """vLLM's truncate_prompt_tokens: the last `keep` tokens (-1: as many as leave room for one output
    token in max_model_len); None: the prompt as it is."""
    if keep is None or (keep != -1 and keep < 1):  # None, or a value SamplingParams refuses: nothing cut
        return prompt_token_ids
    keep = max_model_len - 1 if keep == -1 else keep
    return prompt_token_ids[-keep:] if len(prompt_token_ids) > keep else prompt_token_ids


@dataclass
class SamplingParams:
    """How to pick tokens, as in vLLM. temperature 0 means greedy."""

    n: int = 1
    # A field made with option(...) is also a flag of `specserve generate` and `chat` (cli/args.py).
    temperature: float = option(1.0, "the sampling temperature; 0: greedy (the default at the terminal; the "
                                     "server's is 1.0, as OpenAI's)", parse="temperature")
    top_p: float = option(1.0, "nucleus sampling's mass (default: 1.0, off)", parse="top_p")
    top_k: int = option(-1, "sample among the k likeliest tokens (default: -1, off; 0 too)")
    max_tokens: int = option(128, "tokens to generate at most", parse="positive_int")
    seed: Optional[int] = option(None, "the samples' seed: the same seed, the same output")
    stop: Union[str, Sequence[str], None] = None
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    # True: the log-probability of each chosen token under the model's distribution; an integer k
    # (as in vLLM): that plus the k most likely tokens at each position, with their ids.
    logprobs: Union[bool, int] = False
    # vLLM's prompt_logprobs: an integer k scores the prompt too, each prompt token's log-probability
    # given the tokens before it (the first has none) plus the k most likely there (0: none). Such a
    # request computes every prompt row it has not scored (a cached row has no logits: no prefix-cache hits).
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    # With an engine that speculates: None lets its cost model decide; False: never draft for this
    # request (its tokens are the same either way: speculation is lossless).
    speculative: Optional[bool] = None
    # Guided generation (at most one; specserve/guided): the output must match a JSON Schema (a dict or
    # its JSON text), any JSON object, a regular expression, one of a list of strings, or a Lark / GBNF
    # grammar. Tokens the constraint forces are appended without sampling (fast-forward).
    guided_json: Union[dict, str, None] = None
    guided_json_object: bool = False
    guided_regex: Optional[str] = None
    guided_choice: Optional[Sequence[str]] = None
    guided_grammar: Optional[str] = None
    # n-best (OpenAI's best_of; BASS section 4.5's time budget): draw best_of samples (default n) and
    # answer with the n of highest mean log-probability (the model's, after logit_bias and penalties), best first; with a
    # deadline, samples still running best_of_deadline_s seconds after arrival stop there and the answer
    # holds those finished by then (if none did, the stopped ones, finish_reason "deadline").
    best_of: Optional[int] = None
    best_of_deadline_s: Optional[float] = None
    # OpenAI's logit_bias: {token id: bias in [-100, 100]} added to every logits row of the request
    # before greedy choice, sampling and verification of drafts (so speculation stays lossless against
    # the biased distribution; log-probabilities are of it too, as with the guided masks).
    logit_bias: Optional[dict[int, float]] = None
    # Penalties on tokens already there, as vLLM applies them (after logit_bias, before temperature),
    # to every logits row, a verify span's rows each with the draft tokens before it counted (so
    # speculation stays lossless): repetition_penalty divides a seen token's positive logit and
    # multiplies a negative one (HF transformers' and vLLM's, the prompt's tokens counted too);
    # presence_penalty subtracts once per token the output holds, frequency_penalty once per
    # occurrence (OpenAI's, the output's tokens only).
    presence_penalty: float = option(0.0, "subtract this from the logit of each token the output holds "
                                           "(default: 0)", parse="penalty")
    frequency_penalty: float = option(0.0, "subtract this times a token's count in the output (default: 0)",
                                      parse="penalty")
    repetition_penalty: float = option(1.0, "divide a seen token's positive logit by this, multiply a negative "
                                            "one (default: 1, off)", parse="positive_float")
    # min_p (vLLM's, llama.cpp's): after temperature, tokens less likely than min_p times the likeliest
    # are dropped before top-k and top-p. No effect on greedy choice.
    min_p: float = option(0.0, "drop tokens less likely than this times the likeliest (default: 0, off)",
                          parse="unit")
    # vLLM's min_tokens: no EOS and no stop_token_ids before this many output tokens (their logits are
    # -inf in every row before it, a verify span's rows by their depth), and stop strings are looked
    # for only past it.
    min_tokens: int = option(0, "no EOS or stop before this many tokens (default: 0)")
    # vLLM's allowed_token_ids: every other token's logit is -inf in every row (None: all allowed).
    allowed_token_ids: Optional[Sequence[int]] = None
    # vLLM's include_stop_str_in_output: the stop string that ended the output stays in its text.
    include_stop_str_in_output: bool = False
    # vLLM's bad_words: words the output must not contain. Each is tokenised as it is and after a space
    # (vLLM's two forms); a form's last token gets -inf in every row whose output so far (a verify
    # span's rows: with the draft tokens on their path) ends with the form's other tokens.
    bad_words: Optional[Sequence[str]] = None
    # vLLM's truncate_prompt_tokens: keep only the prompt's last k tokens (at most the context; -1, this
    # engine's rule: the context less one token, room for one output token, where vLLM's -1 keeps the
    # whole context and then refuses it); None: the whole prompt, refused if too long.
    truncate_prompt_tokens: Optional[int] = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None and not isinstance(self.stop, (list, tuple)):
            raise ValueError(f"stop must be a string or a list of strings, got {type(self.stop).__name__}")
        self.stop = list(self.stop or [])
        if isinstance(self.stop_token_ids, (str, bytes)) or not hasattr(self.stop_token_ids, "__iter__"):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}")
        self.stop_token_ids = list(self.stop_token_ids)
        if isinstance(self.allowed_token_ids, (list, tuple, set, frozenset, range)):
            self.allowed_token_ids = list(self.allowed_token_ids)
        if isinstance(self.bad_words, (list, tuple)):
            self.bad_words = list(self.bad_words)
        self.validate()

    def validate(self) -> None:
        """One-line ValueErrors for values vLLM would refuse (and some it would take silently wrong)."""
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if not _is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be an integer: -1 or 0 (off) or >= 1, got {self.top_k!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.best_of is not None and (not _is_int(self.best_of) or self.best_of < self.n):
            raise ValueError(f"best_of must be an integer >= n ({self.n}), got {self.best_of!r}")
        if self.best_of_deadline_s is not None and (not _is_real(self.best_of_deadline_s)
                                                    or not math.isfinite(self.best_of_deadline_s)
                                                    or self.best_of_deadline_s <= 0):
            raise ValueError(f"best_of_deadline_s must be a number of seconds > 0, got {self.best_of_deadline_s!r}")
        last = MAX_SEED - (self.num_samples - 1)
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= last):
            raise ValueError(f"seed must be an integer in [0, {last}] (sample i uses seed + i), got {self.seed!r}")
        if self.speculative is not None and self.speculative is not False:
            raise ValueError(f"speculative must be None (the engine decides) or False (never draft), got {self.speculative!r}")
        if not isinstance(self.stop, (list, tuple)) or not isinstance(self.stop_token_ids, (list, tuple)):
            raise ValueError("stop and stop_token_ids must be lists (set them in SamplingParams(...), which normalises them)")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        if not isinstance(self.logprobs, bool) and not (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise ValueError(f"logprobs must be True/False or an integer k in [0, {MAX_TOP_LOGPROBS}] (the k most likely "
                             f"tokens too), got {self.logprobs!r}")
        if self.prompt_logprobs is not None and not (_is_int(self.prompt_logprobs)
                                                     and 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS):
            raise ValueError(f"prompt_logprobs must be None or an integer k in [0, {MAX_TOP_LOGPROBS}], "
                             f"got {self.prompt_logprobs!r}")
        set_ = [f"guided_{kind}" for kind, _ in self._guided_set()]
        if len(set_) > 1:
            raise ValueError(f"set at most one guided constraint, got {', '.join(set_)}")
        if self.guided_json is not None and not isinstance(self.guided_json, (dict, str)):
            raise ValueError(f"guided_json must be a JSON Schema (a dict or its JSON text), got {type(self.guided_json).__name__}")
        for k in ("guided_regex", "guided_grammar"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"{k} must be a non-empty string, got {v!r}")
        if self.guided_choice is not None and (isinstance(self.guided_choice, str) or not self.guided_choice
                                               or not all(isinstance(c, str) and c for c in self.guided_choice)):
            raise ValueError(f"guided_choice must be a non-empty list of non-empty strings, got {self.guided_choice!r}")
        for k in ("guided_json_object", "ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, k), bool):  # "no" would read as True
                raise ValueError(f"{k} must be True or False, got {getattr(self, k)!r}")
        if self.logit_bias is not None and (
                not isinstance(self.logit_bias, dict) or not all(_is_int(t) and t >= 0 for t in self.logit_bias)
                or not all(_is_real(v) and -100 <= v <= 100 for v in self.logit_bias.values())):
            raise ValueError(f"logit_bias must map token ids (integers >= 0) to numbers in [-100, 100], got {self.logit_bias!r}"[:300])
        for k in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, k)
            if not _is_real(v) or not -2 <= v <= 2:
                raise ValueError(f"{k} must be a number in [-2, 2], got {v!r}")
        if not _is_real(self.repetition_penalty) or not 0 < self.repetition_penalty < float("inf"):
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1: off), got {self.repetition_penalty!r}")
        if not _is_real(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an integer in [0, max_tokens = {self.max_tokens}], got {self.min_tokens!r}")
        if self.min_tokens and self._guided_set():  # a complete grammar ends the output with EOS only
            raise ValueError("min_tokens cannot be combined with guided generation (a complete grammar allows only EOS)")
        if self.allowed_token_ids is not None and self._guided_set():  # fast-forward appends what the grammar forces
            raise ValueError("allowed_token_ids cannot be combined with guided generation (the grammar forces its own tokens)")
        if self.allowed_token_ids is not None and (isinstance(self.allowed_token_ids, (str, bytes, dict))
                                                   or not hasattr(self.allowed_token_ids, "__iter__")
                                                   or not self.allowed_token_ids
                                                   or not all(_is_int(t) and t >= 0 for t in self.allowed_token_ids)):
            raise ValueError(f"allowed_token_ids must be a non-empty list of token ids, got {self.allowed_token_ids!r}"[:300])
        if self.bad_words is not None and (not isinstance(self.bad_words, list)
                                           or not all(isinstance(w, str) and w.strip() for w in self.bad_words)):
            raise ValueError(f"bad_words must be a list of words (non-blank strings), got {self.bad_words!r}"[:300])
        if self.bad_words and self._guided_set():  # fast-forward appends what the grammar forces
            raise ValueError("bad_words cannot be combined with guided generation (the grammar forces its own tokens)")
        if self.truncate_prompt_tokens is not None and (not _is_int(self.truncate_prompt_tokens)
                                                        or not (self.truncate_prompt_tokens == -1
                                                                or self.truncate_prompt_tokens >= 1)):
            raise ValueError(f"truncate_prompt_tokens must be -1 (the context's room) or an integer >= 1, "
                             f"got {self.truncate_prompt_tokens!r}")

    def _guided_set(self) -> list[tuple[str, Any]]:
        """(kind, value) of each guided_<kind> field set, kinds as registry.GUIDED lists them (unset: None,
        or False for a kind that is a switch, json_object)."""
        out = []
        for kind in GUIDED.names():
            value = getattr(self, f"guided_{kind}")
            if value is not None and value is not False:
                out.append((kind, value))
        return out

    def guided(self) -> Optional[tuple[str, object]]:
        """(kind, constraint) as registry.GUIDED names it, or None. A switch (json_object) carries no
        constraint of its own (None); a list of choices is copied (the caller's may change)."""
        for kind, value in self._guided_set():
            return kind, None if value is True else list(value) if isinstance(value, (list, tuple)) else value
        return None

    def truncated(self, prompt_token_ids: list[int], max_model_len: int) -> list[int]:
        """The prompt as served: its last truncate_prompt_tokens tokens (-1: max_model_len - 1), or all."""
        return truncate_prompt(prompt_token_ids, self.truncate_prompt_tokens, max_model_len)

    @property
    def num_samples(self) -> int:
        """Samples drawn: best_of, else n."""
        return self.n if self.best_of is None else self.best_of

    @property
    def ranked(self) -> bool:
        """The answer is the best n samples by mean log-probability (engine/nbest.py), not all in order."""
        return self.best_of is not None or self.best_of_deadline_s is not None

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not False

    @property
    def needs_logprobs(self) -> bool:
        """The engine computes the chosen tokens' log-probabilities: asked for, or to rank the samples."""
        return self.wants_logprobs or self.ranked

    @property
    def num_top_logprobs(self) -> int:
        return 0 if isinstance(self.logprobs, bool) else int(self.logprobs)

    @property
    def penalized(self) -> bool:
        """Some penalty is on: each logits row depends on the tokens before it (sampling/penalties.py)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # needs (re)prefill
    WAITING_FOR_FORK = "waiting_for_fork"  # a sibling of an n>1 request: starts from the leader's prompt KV
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"  # LLMEngine.abort: the caller gave up on it (an exception, Ctrl-C, a client gone)
    DEADLINE = "deadline"  # SamplingParams.best_of_deadline_s passed before it finished
    # its grammar reached a dead end: what it requires next has no spelling in the model's vocabulary
    # (Request.error says what; as vLLM's "error" finish, only this request ends; the server answers 400)
    ERROR = "error"


class TokenOrigin(str, enum.Enum):
    """Who produced an output token (CompletionOutput.origins; `specserve generate --show-origins`
    colours by it, as the staged speculative decoding paper's Figure 3 does). Every token is the
    target's choice in the end (speculation is lossless); the origin says which part of the engine
    proposed it: the target itself (a plain step, or the one token a verify step adds after the
    accepted drafts), or the drafter whose draft the target accepted."""

    TARGET = "target"
    DRAFT = "draft"  # a draft model (the EAGLE draft, or a smaller model)
    LOOKUP = "lookup"  # prompt lookup: copied from the sequence's own tokens
    NGRAM = "ngram"  # the Katz back-off n-gram model
    GRAMMAR = "grammar"  # guided generation: the only token the grammar allowed (fast-forward, not sampled)
    SUFFIX = "suffix"  # suffix drafting: what followed the longest match in this and earlier requests
    LOOKAHEAD = "lookahead"  # lookahead decoding: an n-gram from the target's own Jacobi iterations


@dataclass
class Draft:
    """Proposed tokens for one request, not yet verified: what a drafter made. It travels in the step's
    DraftBatch from the controller's propose to the scheduler, which records it in the request's
    ScheduledRequest (its one place until verification). A chain, or a token tree: then each token
    has a parent (an earlier token's index, -1 for a child of the last known token), in topological
    order, and the tokens are the drafter's top choices at their parent (deterministic: probs None)."""

    tokens: list[int] = field(default_factory=list)
    probs: Optional["torch.Tensor"] = None  # [len(tokens), vocab] q that drew them; None: deterministic/greedy
    # estimated chance each token is accepted given its parent (the tokens before it, in a chain) was:
    # its draft probability for a model (well calibrated for the EAGLE draft), a measured rate for
    # prompt lookup
    confidence: list[float] = field(default_factory=list)
    parents: Optional[list[int]] = None  # a tree: each token's parent; None: a chain
    origin: TokenOrigin = TokenOrigin.DRAFT  # who proposed these tokens (what they count as once accepted)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    def parent_list(self) -> list[int]:
        """Each token's parent (a chain's: the token before it)."""
        return list(range(-1, len(self.tokens) - 1)) if self.parents is None else list(self.parents)

    def depths(self) -> list[int]:
        """Each token's depth (1: right after the last known token): its position offset."""
        if self.parents is None:
            return list(range(1, len(self.tokens) + 1))
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def paths(self) -> list[tuple[int, ...]]:
        """Each token's path: the draft tokens from the last known token's child down to it."""
        out: list[tuple[int, ...]] = []
        for t, p in zip(self.tokens, self.parent_list()):
            out.append((out[p] if p >= 0 else ()) + (t,))
        return out

    def cumulative(self) -> list[float]:
        """Each token's estimated chance of acceptance: the product of the confidences from the root."""
        out: list[float] = []
        for c, p in zip(self.confidence, self.parent_list()):
            out.append(c * (out[p] if p >= 0 else 1.0))
        return out

    def subset(self, keep: Sequence[int]) -> "Draft":
        """The tokens `keep` (increasing indices, each one's parent kept too), as a chain when they
        form one."""
        keep = sorted(keep)
        if len(keep) == len(self.tokens):
            return self
        index = {j: i for i, j in enumerate(keep)}
        parents = self.parent_list()
        if any(parents[j] >= 0 and parents[j] not in index for j in keep):
            raise ValueError(f"draft subset {keep}: a kept token's parent is not kept")
        new_parents = [index.get(parents[j], -1) for j in keep]
        chain = new_parents == list(range(-1, len(keep) - 1))
        return Draft([self.tokens[j] for j in keep], None if self.probs is None else self.probs[keep],
                     [self.confidence[j] for j in keep], None if chain else new_parents, self.origin)


# A step's drafts, request id -> Draft (only requests with draft tokens): what the controller's
# propose returns, guided pruning maps to another, and Scheduler.schedule takes.
DraftBatch = dict[str, Draft]


@dataclass(eq=False)  # identity: two requests are never "equal"
class Request:
    """One sequence being generated. n samples of one prompt are n Requests sharing a `group_id`."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: Optional[int] = None  # this sample's seed (params.seed + sample index)
    group_id: str = ""
    sample_index: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[dict[int, float]] = field(default_factory=list)  # logprobs=k: {id: logprob}, most likely first
    output_origins: list[TokenOrigin] = field(default_factory=list)  # who proposed each output token
    # params.prompt_logprobs: prompt token i's log-probability at index i (None at 0), as far as computed
    prompt_logprobs: list[Optional[float]] = field(default_factory=list)
    prompt_top_logprobs: list[Optional[dict[int, float]]] = field(default_factory=list)  # k > 0: {id: logprob}
    num_computed_tokens: int = 0  # tokens whose KV is in the cache (Scheduler moves it)
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache (not computed for this request)
    block_table: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: Optional[FinishReason] = None
    stop_reason: Union[int, str, None] = None
    error: Optional[str] = None  # finish_reason ERROR: why, in one line
    text: str = ""
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: Optional[float] = None
    finish_time: Optional[float] = None
    leader: Optional["Request"] = None  # for WAITING_FOR_FORK siblings
    # Per verify step, read-only statistics (recorded in one place: SpeculativeDecoder.learn): draft
    # tokens verified, of which accepted, and whose draft it was. Drafters learn from on_verified.
    spec_drafted: list[int] = field(default_factory=list)
    spec_accepted: list[int] = field(default_factory=list)
    spec_origin: list[TokenOrigin] = field(default_factory=list)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def scores_prompt(self) -> bool:
        """params.prompt_logprobs asks for the prompt's log-probabilities and some are not computed yet."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)

    @property
    def past_prompt(self) -> bool:
        """Its prompt is computed: a step of it decodes (its token, drafts, forced tokens), not a prompt chunk."""
        return self.num_computed_tokens >= len(self.prompt_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def token_slice(self, a: int, b: int) -> list[int]:
        """Tokens a..b-1 (prompt and output sliced apart: no copy of the whole sequence)."""
        p = len(self.prompt_token_ids)
        return self.prompt_token_ids[a:min(b, p)] + self.output_token_ids[max(0, a - p):max(0, b - p)]

    def token_at(self, i: int) -> int:
        p = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < p else self.output_token_ids[i - p]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: Optional[str]
    stop_reason: Union[int, str, None] = None
    logprobs: Optional[list[float]] = None  # the chosen tokens' log-probabilities (SamplingParams.logprobs)
    top_logprobs: Optional[list[dict[int, float]]] = None  # logprobs=k: per token, the k most likely {id: logprob}
    time_to_first_token: Optional[float] = None  # seconds, from the request's arrival
    per_token_latency: Optional[float] = None  # seconds per output token after the first
    accepted_per_step: Optional[list[int]] = None  # speculative decoding: drafts accepted at each verify step
    drafted_per_step: Optional[list[int]] = None  # and drafts proposed
    origins: Optional[list[str]] = None  # per token, who proposed it: a TokenOrigin value ("target", "draft", ...)
    cumulative_logprob: Optional[float] = None  # the sum of the tokens' log-probabilities, where computed (vLLM's field)
    error: Optional[str] = None  # finish_reason "error": why, in one line (the text is what came before)


class EngineDeadError(RuntimeError):
    """The engine serving a request stopped (its loop thread failed, or its replica died): the
    request cannot go on. A server answers it as 503."""


@dataclass(frozen=True)
class StreamDelta:
    """What one sample of a request gained in one engine step (AsyncLLM.generate yields these)."""

    index: int  # the sample (0..n-1); for ranked params (best_of, a deadline) its rank, 0 the best
    text: str  # new text (held back while it could still become a stop string)
    token_ids: list[int]  # new token ids
    logprobs: Optional[list[float]] = None  # theirs, where SamplingParams.logprobs asks
    top_logprobs: Optional[list[dict[int, float]]] = None  # logprobs=k: per new token, {id: logprob}
    origins: Optional[list[str]] = None  # per new token, who proposed it (TokenOrigin values)
    finish_reason: Optional[str] = None  # set on the sample's last delta: "stop", "length", "abort", ...
    stop_reason: Union[int, str, None] = None
    error: Optional[str] = None  # finish_reason "error": why, in one line
    # SamplingParams.prompt_logprobs, on a sample's first delta: RequestOutput's fields of the same names
    prompt_logprobs: Optional[list[Optional[float]]] = None
    prompt_top_logprobs: Optional[list[Optional[dict[int, float]]]] = None
    # on a sample's first delta: its prompt's tokens whose KV came from the prefix cache
    num_cached_tokens: Optional[int] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (vLLM's field)
    # SamplingParams.prompt_logprobs: each prompt token's log-probability given those before it (None
    # for the first), and with k > 0 the k most likely {id: logprob} at each position (None for the first)
    prompt_logprobs: Optional[list[Optional[float]]] = None
    prompt_top_logprobs: Optional[list[Optional[dict[int, float]]]] = None

    @property
    def metrics(self) -> dict:
        ttft = [o.time_to_first_token for o in self.outputs if o.time_to_first_token is not None]
        tpot = [o.per_token_latency for o in self.outputs if o.per_token_latency is not None]
        return {"time_to_first_token": min(ttft) if ttft else None,
                "per_token_latency": sum(tpot) / len(tpot) if tpot else None}
