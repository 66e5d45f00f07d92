"""Tiny random-weight Hugging Face models of each supported architecture, saved as HF directories."""
import json
import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

VOCAB = 256

KINDS = {
    "llama": dict(cls="LlamaConfig", model="LlamaForCausalLM", extra={}),
    "llama3-rope": dict(cls="LlamaConfig", model="LlamaForCausalLM", extra=dict(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 32})),
    "llama-mqa-tied": dict(cls="LlamaConfig", model="LlamaForCausalLM", extra=dict(num_key_value_heads=1, tie_word_embeddings=True)),
    "mistral": dict(cls="MistralConfig", model="MistralForCausalLM", extra=dict(sliding_window=None)),
    # a window shorter than the test prompts: every layer attends to its last 12 positions only
    "mistral-window": dict(cls="MistralConfig", model="MistralForCausalLM", extra=dict(sliding_window=12)),
    "qwen2": dict(cls="Qwen2Config", model="Qwen2ForCausalLM", extra=dict(tie_word_embeddings=True)),
}


def byte_tokenizer() -> Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def make_tiny(kind: str, path: str, seed: int = 0):
    import transformers

    spec = KINDS[kind]
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
              bos_token_id=None, eos_token_id=None, tie_word_embeddings=False, initializer_range=0.3)
    kw.update(spec["extra"])
    config = getattr(transformers, spec["cls"])(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, spec["model"])(config).eval()
    with torch.no_grad():  # non-trivial norms, so a wrong norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            if name.endswith("bias"):
                p.normal_(0, 0.3)
    model.save_pretrained(path, safe_serialization=True)
    byte_tokenizer().save(os.path.join(path, "tokenizer.json"))
    json.dump({"add_bos_token": False}, open(os.path.join(path, "tokenizer_config.json"), "w"))
    return model
