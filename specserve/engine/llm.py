"""The public API, in the style of vLLM: LLM(...).generate(prompts, SamplingParams(...))."""
from __future__ import annotations

import numbers
import threading
import warnings
from typing import Callable, Optional, Sequence, Union

import torch
from tqdm.auto import tqdm

from ..config import CacheConfig, EngineConfig, GuidedConfig, LoadConfig, ModelConfig, SchedulerConfig, SpeculativeConfig
from ..types import CompletionOutput, Request, RequestOutput, SamplingParams
from .llm_engine import LLMEngine
from .nbest import pick
from .omp_pool import free_thread_pool

Prompt = Union[str, list[int]]


def prompt_token_ids(tokenizer, prompt, add_special_tokens: bool = True) -> list[int]:
    """A prompt's token ids: a string is tokenised (with the model's BOS where it adds one, unless
    add_special_tokens is False), a list (or tuple) of integers taken as they are; anything else is a
    TypeError (bytes would otherwise read as token ids, None as nothing)."""
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    what = type(prompt).__name__ if not isinstance(prompt, (list, tuple)) else \
        f"a list holding {type(next(t for t in prompt if not isinstance(t, numbers.Integral) or isinstance(t, bool))).__name__}"
    raise TypeError(f"a prompt must be a string or a list of token ids (integers), got {what}")


def chat_token_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                   tools: Optional[list[dict]] = None, continue_final_message: bool = False,
                   template_kwargs: Optional[dict] = None) -> list[int]:
    """A conversation ([{"role", "content"}]) through the tokenizer's chat template, the assistant's turn
    opened unless add_generation_prompt is False (or the last message left open to be continued:
    continue_final_message), with OpenAI-style tool schemas listed where given and the template's own
    variables (template_kwargs) set (a ValueError in one line where the template refuses it or takes no tools)."""
    if tools and not tokenizer.takes_tools:
        raise ValueError("this model's chat template takes no tools (it never reads `tools`)")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message needs add_generation_prompt=False: the first continues the last "
                         "message, the second opens a new assistant turn")
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                             continue_final_message=continue_final_message, template_kwargs=template_kwargs)
    except Exception as e:  # the template's own raise_exception (roles out of order, ...)
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"the chat template refused the messages: {why}") from None
    return tokenizer.encode(text, add_special_tokens=False)


# on_text(prompt index, sample index, new text, finished)
TextCallback = Callable[[int, int, str, bool], None]


class LLM:
    """A language model ready to generate.

    LLM()                                  the embedded SmolLM2-135M-Instruct (GGUF, Q4_1)
    LLM("model.gguf") / LLM("hf_dir/")     any supported Llama-family model
    LLM("model.gguf", speculative="lookup", kv_cache_gib=2.0)

    Each keyword is a field of the config dataclasses in specserve/config.py, documented there (the
    CLI's --help shows the same text): ModelConfig (model ... batch_invariant), LoadConfig (check_*),
    CacheConfig, SchedulerConfig, GuidedConfig (its fields prefixed guided_), and speculative: None
    (regular decoding), a method name (registry.DRAFTERS) or a dict of SpeculativeConfig's fields.
    Speculation and guided fast-forward never change the output: greedy and seeded sampling token for
    token (sampling/seeded.py), unseeded sampling in distribution.
    """

    def __init__(self, model: Optional[str] = None, dtype: str = "auto", device: str = "cpu",
                 block_kernels: bool = True, activations: str = "fp32", num_threads: Optional[int] = None,
                 chat_template: Optional[str] = None, kv_cache_gib: float = 1.0, kv_cache_dtype: str = "auto",
                 block_size: int = 16, max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                 max_model_len: Optional[int] = None, speculative: Union[dict, str, SpeculativeConfig, None] = None,
                 guided_fast_forward: bool = True, enable_prefix_caching: bool = True,
                 prefill_chunk: Union[int, str, None] = "auto", cuda_graphs: bool = True, cuda_rounds: int = 16,
                 batch_invariant: bool = False, check_tensors: bool = False, check_memory: bool = True):
        self.config = EngineConfig(
            model=ModelConfig(model=model, dtype=dtype, device=device, block_kernels=block_kernels,
                              activations=activations, num_threads=num_threads, chat_template=chat_template,
                              cuda_graphs=cuda_graphs,
                              cuda_rounds=cuda_rounds, batch_invariant=batch_invariant),
            load=LoadConfig(check_tensors=check_tensors, check_memory=check_memory),
            cache=CacheConfig(block_size=block_size, kv_cache_gib=kv_cache_gib, kv_cache_dtype=kv_cache_dtype,
                              enable_prefix_caching=enable_prefix_caching),
            scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                      max_model_len=max_model_len, prefill_chunk=prefill_chunk),
            speculative=SpeculativeConfig.from_any(speculative),
            guided=GuidedConfig(fast_forward=guided_fast_forward),
        )
        self.engine = LLMEngine(self.config)
        self.tokenizer = self.engine.tokenizer
        self._lock = threading.Lock()
        self._owner: Optional[int] = None  # the thread inside generate
        self._builder = threading.current_thread()
        # The building thread's OpenMP pool goes, so that a step on any thread finds only its own (omp_pool.py).
        freed = free_thread_pool(refresh=True)  # refresh: the kernels may have brought a libgomp
        self._warned_thread = freed or self.engine.device.type != "cpu" or torch.get_num_threads() < 2  # nothing to warn of

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]], params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = False, on_text: Optional[TextCallback] = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. A prompt is a string or a list of token ids."""
        if self._owner == threading.get_ident():
            raise RuntimeError("LLM.generate was called from inside its own on_text callback; call it after generate returns")
        self._warn_if_off_thread()
        with self._lock:  # one call at a time from any number of threads: steps never interleave
            self._owner = threading.get_ident()
            try:
                return self._generate(prompts, params, use_tqdm, on_text)
            finally:
                self._owner = None
                free_thread_pool()  # the next call may come from another thread

    def _warn_if_off_thread(self) -> None:
        """Once, where the OpenMP pools cannot be freed (no libgomp with OpenMP 5.0's pause): steps on
        another thread than the one that built this LLM run slower on CPU. libgomp keeps an OpenMP pool
        per thread, and while the pools outnumber the cores its threads sleep between a step's parallel
        regions (1.7x slower on 2 cores: docs/decisions.md#omp-pools)."""
        if self._warned_thread or threading.current_thread() is self._builder or not self._builder.is_alive():
            return
        self._warned_thread = True
        warnings.warn("LLM.generate runs on another thread than the one that built this LLM: on CPU its steps are up to "
                      "~1.7x slower there (each thread keeps its own OpenMP pool). Call it from the thread that built "
                      "the LLM, or use AsyncLLM, which steps on the thread it builds on.", RuntimeWarning, stacklevel=3)

    def _generate(self, prompts, params, use_tqdm: bool, on_text: Optional[TextCallback]) -> list[RequestOutput]:
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], numbers.Integral)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"prompts must be a string, a list of token ids, or a list of those; got {type(prompts).__name__}")
        prompts = list(prompts)
        params = params or SamplingParams()
        param_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(param_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(param_list)} SamplingParams")
        # Everything is checked before anything is queued: a bad prompt late in the list leaves no work behind.
        ids_list, texts = [], []
        for prompt, p in zip(prompts, param_list):
            ids = prompt_token_ids(self.tokenizer, prompt)
            self.engine.check_request(ids, p)
            ids_list.append(ids)
            texts.append(prompt if isinstance(prompt, str) else None)
        groups: list[list[Request]] = []
        bar = tqdm(total=sum(p.num_samples for p in param_list), desc="generate", disable=not use_tqdm, unit="seq")
        try:
            for ids, p in zip(ids_list, param_list):
                groups.append(self.engine.add_request(ids, p))
            where = {r.request_id: (gi, r.sample_index) for gi, g in enumerate(groups) for r in g}
            while self.engine.has_unfinished():
                for req, delta in self.engine.step():
                    if on_text is not None and (delta or req.is_finished):
                        gi, si = where[req.request_id]
                        on_text(gi, si, delta, req.is_finished)
                    if req.is_finished:
                        bar.update(1)
        except BaseException:  # an error, Ctrl-C, a failing on_text: free exactly this call's requests
            self.engine.abort([r.request_id for g in groups for r in g])
            raise
        finally:
            bar.close()
        return [self._output(g, t) for g, t in zip(groups, texts)]

    def spec_stats(self) -> Optional[dict]:
        """What speculative decoding has done since the engine started (or reset_spec_stats): steps,
        drafted and accepted tokens, alpha, tokens per target step, seconds, and c (draft step over
        target step at batch 1, measured); staged drafting adds alpha, c and k per stage pair and the
        gain they predict; with rounds on the GPU (cuda_rounds), what was drafted and accepted there is
        under "device_rounds" (the ordinary steps' figures leave it out). None without speculation."""
        spec, rounds = self.engine.speculator, self.engine.rounds
        if spec is None:
            return None
        return {**spec.stats.as_dict(), "c": spec.c, **spec.hierarchy(),
                **({"device_rounds": rounds.stats()} if rounds is not None else {})}

    def reset_spec_stats(self) -> None:
        with self._lock:
            if self.engine.speculator is not None:
                self.engine.speculator.reset_stats()
            if self.engine.rounds is not None:
                self.engine.rounds.reset_stats()

    def chat(self, messages: Union[list[dict], Sequence[list[dict]]], params: Optional[SamplingParams] = None,
             tools: Optional[list[dict]] = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: Optional[dict] = None,
             **kwargs) -> list[RequestOutput]:
        """Apply the model's chat template to each conversation (a list of {"role", "content"}) and generate
        (a ValueError in one line where the template refuses one). tools: OpenAI's function schemas
        ([{"type": "function", "function": {"name", "description", "parameters"}}]) for the template to
        list; the calls come back as the model writes them (Qwen2.5: <tool_call> blocks in the text).
        continue_final_message (vLLM's; with add_generation_prompt=False): the output continues the last
        message, an assistant's answer begun for the model (a prefill). chat_template_kwargs (vLLM's):
        more variables for the template."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [chat_token_ids(self.tokenizer, c, add_generation_prompt, tools, continue_final_message, chat_template_kwargs)
                   for c in convs]
        return self.generate(prompts, params, **kwargs)

    @staticmethod
    def _output(group: list[Request], prompt: Optional[str]) -> RequestOutput:
        """Every sample in order; for ranked params (best_of, a deadline) the best n, best first
        (engine/nbest.py), each with its rank as index."""
        outs = []
        ranked = group[0].params.ranked
        for rank, r in enumerate(pick(group)):
            n = len(r.output_token_ids)
            ttft = None if r.first_token_time is None else r.first_token_time - r.arrival_time
            tpot = (r.finish_time - r.first_token_time) / (n - 1) if n > 1 and r.finish_time else None
            outs.append(CompletionOutput(
                index=rank if ranked else r.sample_index, text=r.text, token_ids=list(r.output_token_ids),
                finish_reason=r.finish_reason.value if r.finish_reason else None, stop_reason=r.stop_reason,
                logprobs=list(r.output_logprobs) if r.params.wants_logprobs else None,
                top_logprobs=list(r.output_top_logprobs) if r.params.num_top_logprobs else None,
                time_to_first_token=ttft, per_token_latency=tpot,
                accepted_per_step=list(r.spec_accepted) if r.spec_drafted else None,
                drafted_per_step=list(r.spec_drafted) if r.spec_drafted else None,
                origins=[o.value for o in r.output_origins],
                cumulative_logprob=sum(r.output_logprobs) if r.params.needs_logprobs else None, error=r.error))
        lead, k = group[0], group[0].params.prompt_logprobs  # the leader scored the prompt
        return RequestOutput(lead.group_id, prompt, list(lead.prompt_token_ids), outs, num_cached_tokens=lead.num_cached_tokens,
                             prompt_logprobs=None if k is None else list(lead.prompt_logprobs),
                             prompt_top_logprobs=list(lead.prompt_top_logprobs) if k else None)
