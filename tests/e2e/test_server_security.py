"""Who may talk to the server (issue 36): the API key from the flag, $SPECSERVE_API_KEY or
--api-key-file, guarding /v1/* and the API docs; the Host header checked against loopback names by
default on a loopback server (DNS rebinding), configurable with --allowed-hosts."""
import argparse
import http.client
import json

import pytest

from .serving import running

pytest.importorskip("uvicorn")
KEY = "s3cret-key"


@pytest.fixture(scope="module")
def llm():
    from specserve import AsyncLLM
    llm = AsyncLLM(kv_cache_gib=0.1, max_model_len=256)
    yield llm
    llm.shutdown()


def serve(llm, **cfg):
    from specserve.server.app import build_app
    from specserve.server.config import ServerConfig
    return running(build_app(llm, ServerConfig(**cfg)))


def get(port, path, key=None, host=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.putrequest("GET", path, skip_host=host is not None)
    if host is not None:
        conn.putheader("Host", host)
    if key is not None:
        conn.putheader("Authorization", f"Bearer {key}")
    conn.endheaders()
    r = conn.getresponse()
    out = r.status, r.read()
    conn.close()
    return out


@pytest.mark.parametrize("source", ["flag", "env", "file"])
def test_the_key_from_each_source_guards_the_api_and_its_docs(llm, source, monkeypatch, tmp_path):
    cfg = {}
    if source == "flag":
        cfg["api_key"] = KEY
    elif source == "env":
        monkeypatch.setenv("SPECSERVE_API_KEY", KEY)
    else:
        (tmp_path / "key").write_text(KEY + "\n")
        cfg["api_key_file"] = str(tmp_path / "key")
    with serve(llm, **cfg) as port:
        for path in ("/v1/models", "/docs", "/redoc", "/openapi.json"):
            for wrong in (None, "x" * len(KEY), KEY + "x"):
                status, body = get(port, path, wrong)
                assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error", (path, wrong)
            assert get(port, path, KEY)[0] == 200, path
        for path in ("/tokenize", "/detokenize"):  # the API outside /v1/ (POST: a keyed GET is a 405, past the guard)
            assert get(port, path)[0] == 401 and get(port, path, KEY)[0] == 405, path
        assert get(port, "/health")[0] == 200 and get(port, "/metrics")[0] == 200  # open, as in vLLM


def test_the_flag_wins_over_the_file_and_the_file_over_the_environment(monkeypatch, tmp_path):
    from specserve.server.config import ServerConfig
    from specserve.server.security import api_key
    (tmp_path / "key").write_text("from-file\nsecond line ignored\n")
    env = {"SPECSERVE_API_KEY": "from-env"}
    assert api_key(ServerConfig(api_key="from-flag", api_key_file=str(tmp_path / "key")), env) == "from-flag"
    assert api_key(ServerConfig(api_key_file=str(tmp_path / "key")), env) == "from-file"
    assert api_key(ServerConfig(), env) == "from-env" and api_key(ServerConfig(), {}) is None


@pytest.mark.parametrize("content, words", [(None, "No such file"), ("\n", "holds no key")])
def test_a_bad_key_file_fails_in_one_line_before_serving(llm, tmp_path, content, words):
    from specserve.server.app import build_app
    from specserve.server.config import ServerConfig
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=words) as e:
        build_app(llm, ServerConfig(api_key_file=str(path)))
    assert "\n" not in str(e.value)


def test_a_loopback_server_answers_loopback_host_names_only(llm):
    with serve(llm) as port:
        for host in ("localhost", f"localhost:{port}", "127.0.0.1", f"127.0.0.1:{port}", "[::1]", f"[::1]:{port}",
                     "LOCALHOST:1"):
            assert get(port, "/health", host=host)[0] == 200, host
        for host in ("evil.example", f"evil.example:{port}", "localhost.evil.example", "127.0.0.1.nip.io:80"):
            for path in ("/health", "/metrics", "/v1/models"):
                status, body = get(port, path, host=host)
                assert status == 400 and "Host" in json.loads(body)["error"]["message"], (host, path)


def test_allowed_hosts_names_the_hosts_or_any(llm):
    with serve(llm, allowed_hosts="api.example, other.example") as port:
        assert get(port, "/health", host="api.example:8000")[0] == 200
        assert get(port, "/health", host="other.example")[0] == 200
        assert get(port, "/health", host="localhost")[0] == 400
    with serve(llm, allowed_hosts="*") as port:
        assert get(port, "/health", host="anything.example")[0] == 200


def test_a_server_bound_beyond_loopback_checks_no_host_by_default():
    from specserve.server.config import ServerConfig
    from specserve.server.security import allowed_hosts
    assert allowed_hosts(ServerConfig(host="0.0.0.0")) is None
    assert "localhost" in allowed_hosts(ServerConfig(host="127.0.0.1"))
    assert allowed_hosts(ServerConfig(host="0.0.0.0", allowed_hosts="a.example")) == {"a.example"}


def test_the_new_settings_are_serve_flags(tmp_path):
    from specserve.cli.serve import add_serve_args
    p = argparse.ArgumentParser()
    add_serve_args(p)
    args = p.parse_args(["--api-key-file", str(tmp_path / "k"), "--allowed-hosts", "a.example,b.example"])
    assert args.api_key_file == str(tmp_path / "k") and args.allowed_hosts == "a.example,b.example"
    assert "SPECSERVE_API_KEY" in p.format_help()
