import os

import gguf
import pytest


@pytest.fixture(scope="module", autouse=True)
def one_gguf_parse_per_file():
    """HF transformers parses a GGUF's fields anew for the config, for the weights and for the tokenizer
    (gguf-py reads the vocabulary element by element: ~40 s a parse of Gemma 3's 262k tokens on an
    AVX2-only Zen 3). The reader is read-only, so one per file, kept for the module, serves all three;
    what HF builds from it is unchanged."""
    readers: dict = {}

    def reader(path, mode="r", make=gguf.GGUFReader):
        if mode != "r":  # a writable map sees its own writes: never shared
            return make(path, mode)
        st = os.stat(path)  # a file written again at the same path is parsed again
        key = (str(path), st.st_mtime_ns, st.st_size)
        if key not in readers:
            readers[key] = make(path, mode)
        return readers[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", reader)
        yield
