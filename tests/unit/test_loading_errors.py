"""Bad model inputs give one clear line naming the file and what is supported."""
import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from specserve.loading import load_model_files


def writer(path, arch="llama", embedding_length=32, block_count=1) -> GGUFWriter:
    """A GGUF writer with a tiny model's header (hidden 32, FFN 64, 4 heads, a 2-token vocabulary)."""
    w = GGUFWriter(str(path), arch)
    w.add_block_count(block_count)
    w.add_embedding_length(embedding_length)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_context_length(64)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b"])
    w.add_token_merges([])
    return w


def finish(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf(path, arch="llama", qtype=None):
    w = writer(path, arch)
    if qtype is None:
        w.add_tensor("token_embd.weight", np.zeros((2, 32), np.float32))
    else:  # raw bytes of one 256-element block of the given type
        w.add_tensor("token_embd.weight", np.zeros((1, 176 if qtype == GGMLQuantizationType.Q5_K else 144), np.uint8),
                     raw_dtype=qtype)
    finish(w)


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
    with pytest.raises(ValueError, match=r"x\.gguf: not a GGUF file"):
        load_model_files(str(p))


def test_unsupported_hf_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match=r"architecture \['GPT2LMHeadModel'\] is not supported \(supported: LlamaForCausalLM"):
        load_model_files(str(tmp_path))


def _hf_dir(tmp_path, cfg: dict, tensors=None, raw: bytes = None):
    import json
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    path = tmp_path / "model.safetensors"
    if raw is not None:
        path.write_bytes(raw)
    elif tensors is not None:
        from safetensors.torch import save_file
        save_file(tensors, str(path))
    return str(tmp_path)


TINY_CFG = {"architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 64}


@pytest.mark.parametrize("case, match", [
    ("missing key", "the key 'hidden_size' is missing"),
    ("bad json", "not valid JSON"),
    ("corrupt weights", "cannot read this safetensors file"),
    ("missing tensors", "tensors missing from the checkpoint"),
])
def test_broken_hf_directories_give_one_line_errors(tmp_path, case, match):
    import torch

    from specserve.loading.hf import load_hf_dir
    cfg = dict(TINY_CFG)
    if case == "missing key":
        del cfg["hidden_size"]
        path = _hf_dir(tmp_path, cfg, raw=b"")
    elif case == "bad json":
        path = _hf_dir(tmp_path, cfg, raw=b"")
        (tmp_path / "config.json").write_text("{not json")
    elif case == "corrupt weights":
        path = _hf_dir(tmp_path, cfg, raw=b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!")
    else:
        path = _hf_dir(tmp_path, cfg, tensors={"model.embed_tokens.weight": torch.zeros(32, 8)})
    with pytest.raises(ValueError, match=match) as e:
        load_hf_dir(path, with_tokenizer=False)
    assert "\n" not in str(e.value)


def write_model_gguf(path, embedding_length=32, block_count=1, q_shape=(32, 32)):
    """A whole one-layer llama GGUF (F32 tensors), its header and tensors editable to disagree."""
    w = writer(path, embedding_length=embedding_length, block_count=block_count)
    z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", z(2, 32))
    w.add_tensor("output_norm.weight", z(32))
    w.add_tensor("output.weight", z(2, 32))
    shapes = {"attn_norm": (32,), "ffn_norm": (32,), "attn_q": q_shape, "attn_k": (32, 32), "attn_v": (32, 32),
              "attn_output": (32, 32), "ffn_gate": (64, 32), "ffn_up": (64, 32), "ffn_down": (32, 64)}
    for name, shape in shapes.items():
        w.add_tensor(f"blk.0.{name}.weight", z(*shape))
    finish(w)


def test_a_whole_tiny_model_loads(tmp_path):
    write_model_gguf(p := tmp_path / "ok.gguf")
    _, arch, weights, _ = load_model_files(str(p))
    assert arch.hidden_size == 32 and weights["layers.0.q"].shape == (32, 32)


@pytest.mark.parametrize("case,match", [
    ("truncated", r"cut\.gguf: truncated: tensor blk\.0\.\w+\.weight needs bytes up to \d+, the file has \d+"),
    ("huge-embedding", r"cut\.gguf: tensor token_embd\.weight has shape \[2, 32\], the header's hyper-parameters imply \[2, 1000000\]"),
    ("block-count", r"cut\.gguf: tensors missing for a 5-layer llama model \(e\.g\. layers\.1\."),
    ("tensor-shape", r"cut\.gguf: tensor blk\.0\.attn_q\.weight has shape \[32, 16\], the header's hyper-parameters imply \[32, 32\]"),
    ("magic", r"cut\.gguf: not a GGUF file"),
    ("header", r"cut\.gguf: truncated GGUF header"),
])
def test_corrupted_files_are_one_line_errors_before_anything_is_allocated(tmp_path, case, match, capsys):
    p = tmp_path / "cut.gguf"
    write_model_gguf(p, embedding_length=1_000_000 if case == "huge-embedding" else 32,
                     block_count=5 if case == "block-count" else 1, q_shape=(32, 16) if case == "tensor-shape" else (32, 32))
    data = p.read_bytes()
    if case == "truncated":
        p.write_bytes(data[:-100])
    elif case == "magic":
        p.write_bytes(b"GGML" + data[4:])
    elif case == "header":
        p.write_bytes(data[:200])
    with pytest.raises(ValueError, match=match):
        load_model_files(str(p))
    from specserve.cli.main import main
    assert main(["generate", "x", "--model", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cut.gguf" in err[0], err
