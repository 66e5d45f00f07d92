"""Schemathesis against /openapi.json, as vLLM's tests/entrypoints/openai/test_openapi_schema.py: every
documented operation gets generated requests, valid and invalid, and none may be answered with a 5xx
or hang. Bounded: a few dozen examples per operation, a short context so fuzzed lengths stay cheap,
max_tokens kept small, 30 s per request, loopback only."""
import pytest

from .serving import running

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")
MAX_TOKENS = 4  # generated lengths above this are cut to it: the run is about answers, not long outputs
EXAMPLES = 80  # per operation and mode


@pytest.fixture(scope="module")
def server():
    from specserve import AsyncLLM
    from specserve.server.app import build_app
    from specserve.server.config import ServerConfig

    llm = AsyncLLM(kv_cache_gib=0.1, max_model_len=256)
    with running(build_app(llm, ServerConfig(max_n=2, max_prompts=2, max_concurrent_requests=8))) as port:
        yield f"http://127.0.0.1:{port}"
    llm.shutdown()


def keep_short(body):
    """Generated max_tokens / max_completion_tokens / n / best_of above a few are cut to MAX_TOKENS, and
    a body without a length gets MAX_TOKENS (chat's default, the rest of the context, is slow here)."""
    if isinstance(body, dict):
        if "max_tokens" not in body and "max_completion_tokens" not in body:
            body["max_tokens"] = MAX_TOKENS
        for k in ("max_tokens", "max_completion_tokens", "n", "best_of"):
            v = body.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > MAX_TOKENS:
                body[k] = MAX_TOKENS
        if body.get("best_of_deadline_s") is not None:
            body["best_of_deadline_s"] = 5
    return body


# Each operation's cases come from Schemathesis' strategies under plain Hypothesis (its pytest plugin's
# lazy fixtures do not run under pytest 9), valid and invalid ones alike.
# the positive cases (56 s on an AVX2-only Zen 3: each one generates) in `make test-all` only
@pytest.mark.parametrize("mode", [pytest.param("positive", marks=pytest.mark.full), "negative"])
def test_no_generated_request_gets_a_5xx_or_hangs(server, mode):
    from schemathesis.config import SchemathesisConfig
    from schemathesis.generation import GenerationMode
    config = SchemathesisConfig()
    config.projects.default.generation.update(allow_x00=False)  # as vLLM: no NUL bytes in strings
    api = schemathesis.openapi.from_url(f"{server}/openapi.json", config=config)
    ops = [r.ok() for r in api.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in ops} >= {"POST /v1/completions", "POST /v1/chat/completions",
                                                                  "GET /v1/models/{model_id}", "GET /health"}
    answered = []
    for op in ops:
        if mode == "negative" and not op.body:
            continue  # nothing to make invalid: no parameters, or a path's free string (a model's name)
        @hypothesis.settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                             suppress_health_check=list(hypothesis.HealthCheck), phases=[hypothesis.Phase.generate])
        @hypothesis.given(case=op.as_strategy(GenerationMode(mode)))
        def one(case):
            case.body = keep_short(case.body)
            response = case.call(base_url=server, timeout=30)  # a hang fails here (requests' ReadTimeout)
            assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])
            if response.status_code >= 400:
                assert response.json()["error"]["code"] == response.status_code
            answered.append(response.status_code)

        one()
    print(f"{mode}: {len(answered)} requests, statuses {sorted(set(answered))}")
    assert len(answered) >= 5 * (len(ops) if mode == "positive" else 2)  # the run really sent requests
    assert any(400 <= status < 500 for status in answered)
    assert mode == "negative" or any(status == 200 for status in answered)  # valid bodies got served too
