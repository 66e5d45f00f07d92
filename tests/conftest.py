import pytest


@pytest.fixture(scope="session")
def embedded_llm():
    from specserve import LLM
    return LLM()
