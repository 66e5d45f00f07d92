"""Bad model inputs give one clear line naming the file and what is supported."""
import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from specserve.loading import load_model_files


def write_gguf(path, arch="llama", qtype=None):
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_context_length(64)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b"])
    w.add_token_merges([])
    if qtype is None:
        w.add_tensor("token_embd.weight", np.zeros((2, 32), np.float32))
    else:  # raw bytes of one 256-element block of the given type
        w.add_tensor("token_embd.weight", np.zeros((1, 176 if qtype == GGMLQuantizationType.Q5_K else 144), np.uint8),
                     raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_missing_path():
    with pytest.raises(FileNotFoundError, match="/no/such/model"):
        load_model_files("/no/such/model")


def test_unsupported_gguf_architecture(tmp_path):
    p = tmp_path / "m.gguf"
    write_gguf(p, arch="gpt2")
    with pytest.raises(ValueError, match=r"m\.gguf: architecture 'gpt2' is not supported \(supported: llama"):
        load_model_files(str(p))


def test_unsupported_quantization_type(tmp_path):
    p = tmp_path / "q.gguf"
    write_gguf(p, qtype=GGMLQuantizationType.Q4_K)  # supported: loads
    write_gguf(p2 := tmp_path / "q5.gguf", qtype=GGMLQuantizationType.Q5_K)
    with pytest.raises(ValueError, match=r"q5\.gguf: tensor token_embd\.weight has quantization type Q5_K.*supported: F32"):
        load_model_files(str(p2))


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"x\.gguf: not a readable GGUF file"):
        load_model_files(str(p))


def test_unsupported_hf_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match=r"architecture \['GPT2LMHeadModel'\] is not supported \(supported: LlamaForCausalLM"):
        load_model_files(str(tmp_path))
