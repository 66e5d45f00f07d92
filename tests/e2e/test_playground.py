"""The playground page (`GET /`) in a real browser: headless Chromium loads it from a server on
loopback, a prompt is typed and sent, and the answer streams in: the same text as LLM.chat gives
(greedy, speculation on: lossless), coloured by token origin, with the page's figures filled in.

Skipped where no browser is installed; `make test-browser` installs Chromium and its driver from
Debian's packages and selenium, runs this test, and keeps its screenshot as docs/playground.png
(SPECSERVE_SCREENSHOT names where it goes; else the test's temporary folder)."""
import os
import shutil
import time

import pytest

from specserve import SamplingParams

from .serving import running

webdriver = pytest.importorskip("selenium.webdriver", reason="the browser test needs selenium: make test-browser")
uvicorn = pytest.importorskip("uvicorn")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="no Chromium / chromedriver: make test-browser")
PROMPT = "Write a Python function that returns the squares of a list of numbers."
MAX_TOKENS = 96


@pytest.fixture(scope="module")
def server():
    from specserve import AsyncLLM
    from specserve.server.app import build_app
    from specserve.server.config import ServerConfig

    llm = AsyncLLM(kv_cache_gib=0.25, speculative="draft")  # the EAGLE draft: its tokens show in blue
    with running(build_app(llm, ServerConfig())) as port:
        yield f"http://127.0.0.1:{port}"
    llm.shutdown()


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,860"):
        opts.add_argument(arg)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield drv
    drv.quit()


def wait_for(condition, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = condition()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_a_prompt_sent_from_the_page_streams_in_coloured_by_origin(server, browser, embedded_llm, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    wait_for(lambda: "context" in browser.find_element(By.ID, "model").text, 30, "the model name from /v1/models")
    max_tokens = browser.find_element(By.ID, "max_tokens")
    max_tokens.clear()
    max_tokens.send_keys(str(MAX_TOKENS))
    browser.find_element(By.ID, "prompt").send_keys(PROMPT)
    browser.find_element(By.ID, "send").click()

    answer = lambda: browser.find_elements(By.CSS_SELECTOR, ".assistant .text")  # noqa: E731
    # streamed: text shows while the Stop button is still live (the answer is not complete yet)
    wait_for(lambda: answer() and answer()[-1].text and browser.find_element(By.ID, "stop").is_enabled(), 60,
             "the first streamed text")
    wait_for(lambda: browser.find_element(By.ID, "send").is_enabled(), 120, "the answer to finish")

    want = embedded_llm.chat([{"role": "user", "content": PROMPT}], SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    want = want[0].outputs[0]
    text_el = answer()[-1]
    got = browser.execute_script("return arguments[0].textContent", text_el)
    assert got == want.text  # greedy through the page = LLM.chat: speculation changed nothing
    spans = text_el.find_elements(By.CSS_SELECTOR, "span[data-origin]")
    origins = {s.get_attribute("data-origin") for s in spans}
    assert origins and origins <= {"target", "draft", "lookup", "ngram", "suffix", "lookahead", "grammar"}
    assert "draft" in origins  # the draft's accepted tokens are coloured apart from the target's
    assert browser.find_element(By.ID, "f-tokens").text == str(len(want.token_ids))
    assert float(browser.find_element(By.ID, "f-per-step").text) > 1.0  # drafts accepted: > 1 token a step
    assert browser.find_element(By.ID, "f-tps").text not in ("", "–")
    wait_for(lambda: browser.find_element(By.ID, "e-accept").text not in ("", "–"), 5, "the engine figures from /metrics")

    shot = os.environ.get("SPECSERVE_SCREENSHOT") or str(tmp_path / "playground.png")
    os.makedirs(os.path.dirname(os.path.abspath(shot)), exist_ok=True)
    assert browser.save_screenshot(shot) and os.path.getsize(shot) > 10_000
