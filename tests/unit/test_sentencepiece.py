"""The SentencePiece ("llama") GGUF vocabulary: merges by score, byte fallback, the space prefix,
user-defined pieces matched whole, and the turn-end stop tokens. A tiny hand-made vocabulary, where
each case's answer can be worked out by hand; the real Gemma vocabulary is checked against llama.cpp
and HF in tests/model/test_real_models.py."""
import pytest

from specserve.loading.tokenizer import Tokenizer

NORMAL, CONTROL, USER, BYTE = 1, 3, 4, 6


def vocab(pieces, add_space_prefix=False):
    """pieces: [(text, score, type)] after <unk> <bos> <eos> and the 256 byte pieces."""
    head = [("<unk>", 0.0, 2), ("<bos>", 0.0, CONTROL), ("<eos>", 0.0, CONTROL)]
    head += [(f"<0x{b:02X}>", 0.0, BYTE) for b in range(256)]
    allp = head + pieces
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [p[0] for p in allp],
        "tokenizer.ggml.scores": [p[1] for p in allp],
        "tokenizer.ggml.token_type": [p[2] for p in allp],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }


BASE = [("\u2581", -1.0, NORMAL), ("a", -2.0, NORMAL), ("b", -3.0, NORMAL), ("c", -4.0, NORMAL)]


def pieces(tok, text):
    return [tok.backend.id_to_token(i) for i in tok.encode(text, add_special_tokens=False)]


@pytest.mark.parametrize("ab,bc,expect", [(-5.0, -6.0, ["ab", "c"]), (-6.0, -5.0, ["a", "bc"])])
def test_the_pair_whose_piece_scores_highest_merges_first(ab, bc, expect):
    tok = Tokenizer.from_gguf_fields(vocab(BASE + [("ab", ab, NORMAL), ("bc", bc, NORMAL)]), "t.gguf")
    assert pieces(tok, "abc") == expect


def test_unknown_characters_fall_back_to_bytes_and_decode_back():
    tok = Tokenizer.from_gguf_fields(vocab(BASE), "t.gguf")
    assert pieces(tok, "aé") == ["a", "<0xC3>", "<0xA9>"]
    assert tok.decode(tok.encode("a é b")) == "a é b"


def test_spaces_are_spelled_u2581_and_the_prefix_follows_the_header():
    fields = BASE + [("\u2581a", -5.0, NORMAL)]
    plain = Tokenizer.from_gguf_fields(vocab(fields), "t.gguf")
    prefixed = Tokenizer.from_gguf_fields(vocab(fields, add_space_prefix=True), "t.gguf")
    assert pieces(plain, "a a") == ["a", "\u2581a"]
    assert pieces(prefixed, "a a") == ["\u2581a", "\u2581a"]
    assert prefixed.decode(prefixed.encode("a a")) == "a a"  # the prefix is stripped again
    assert prefixed.encode("a")[0] == 1  # add_bos


def test_user_defined_pieces_match_whole_and_space_runs_merge_first():
    """Gemma: "\\n\\n" is a user-defined piece matched in the raw text; "  " (stored with real spaces)
    is a run of U+2581 that merges before the normal pieces, as llama.cpp matches it first."""
    fields = BASE + [("\u2581a", -5.0, NORMAL), ("\n", -1000.0, USER), ("\n\n", -1000.0, USER), ("  ", -1000.0, USER)]
    tok = Tokenizer.from_gguf_fields(vocab(fields), "t.gguf")
    assert pieces(tok, "a\n\nb") == ["a", "\n\n", "b"]
    assert pieces(tok, "b  a") == ["b", "\u2581\u2581", "a"]  # not "▁" + "▁a"
    assert tok.decode(tok.encode("b  a\n\n")) == "b  a\n\n"


def test_turn_end_control_tokens_stop_generation():
    tok = Tokenizer.from_gguf_fields(vocab(BASE + [("<end_of_turn>", 0.0, CONTROL)]), "t.gguf")
    assert tok.eos_token_ids == [2, len(tok.backend.get_vocab()) - 1]


def test_a_vocabulary_without_scores_is_refused_in_one_line():
    fields = vocab(BASE)
    del fields["tokenizer.ggml.scores"]
    with pytest.raises(ValueError, match="t.gguf: a SentencePiece vocabulary needs a score per token"):
        Tokenizer.from_gguf_fields(fields, "t.gguf")


def test_a_gemma_file_without_a_template_gets_gemmas_turns():
    """As llama.cpp's built-in templates: no system role, the system text opens the first user turn."""
    fields = vocab(BASE) | {"general.architecture": "gemma3"}
    tok = Tokenizer.from_gguf_fields(fields, "t.gguf")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi "},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    assert tok.apply_chat_template(chat) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    with pytest.raises(ValueError, match="no chat template"):  # other files without one still say so
        Tokenizer.from_gguf_fields(vocab(BASE), "t.gguf").apply_chat_template(chat)


def test_the_merge_order_is_cached_and_a_bad_cache_is_rebuilt(tmp_path, monkeypatch):
    """Gemma's 513k merges took 1.1 s a load to rebuild: the order is kept under a hash of the vocabulary,
    read back on the next load (nothing rebuilt), and rebuilt where the file is unreadable."""
    from specserve.loading import gguf_vocab as tk
    monkeypatch.setenv("SPECSERVE_CACHE_DIR", str(tmp_path))
    fields = vocab(BASE + [("ab", -5.0, NORMAL), ("bc", -6.0, NORMAL), ("abc", -7.0, NORMAL)])
    first = pieces(Tokenizer.from_gguf_fields(fields, "t.gguf"), "abcab")
    [cached] = (tmp_path / "tokenizers").glob("spm-merges-*.npy")
    built = tk._merge_order
    monkeypatch.setattr(tk, "_merge_order", lambda *a: pytest.fail("rebuilt though cached"))
    assert pieces(Tokenizer.from_gguf_fields(fields, "t.gguf"), "abcab") == first == ["abc", "ab"]
    other = vocab(BASE + [("ab", -6.0, NORMAL), ("bc", -5.0, NORMAL), ("abc", -7.0, NORMAL)])  # scores differ: a new key
    monkeypatch.setattr(tk, "_merge_order", built)
    assert pieces(Tokenizer.from_gguf_fields(other, "t.gguf"), "abcab") == ["abc", "ab"]
    assert len(list((tmp_path / "tokenizers").glob("spm-merges-*.npy"))) == 2
    cached.write_bytes(b"not numpy")
    assert pieces(Tokenizer.from_gguf_fields(fields, "t.gguf"), "abcab") == first
    monkeypatch.setenv("SPECSERVE_CACHE_DIR", "")  # caching off: built, nothing written
    for f in (tmp_path / "tokenizers").glob("*"):
        f.unlink()
    assert pieces(Tokenizer.from_gguf_fields(fields, "t.gguf"), "abcab") == first
    assert not list((tmp_path / "tokenizers").glob("*"))
