"""Chat templates beyond the model's own rendering: continue_final_message (HF's apply_chat_template,
vLLM's LLM.chat and chat endpoint: the last message left open so the model continues it, an
assistant's answer begun for it), a template in place of the model's (vLLM's --chat-template) and
chat_template_kwargs."""
import pytest

from specserve import LLM, SamplingParams

render_jinja_template = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template

USER = {"role": "user", "content": "Write a Python function that adds two numbers."}
BEGUN = ["def add(", "Sure, here is the function:\n\n```python\n", "  leading space", "trailing space  ", "ends in a newline\n"]


@pytest.mark.parametrize("begun", BEGUN)
def test_the_open_message_renders_as_hf_transformers_does(embedded_llm, begun):
    tok = embedded_llm.tokenizer
    conv = [USER, {"role": "assistant", "content": begun}]
    ours = tok.apply_chat_template(conv, add_generation_prompt=False, continue_final_message=True)
    hf = render_jinja_template([conv], chat_template=tok.chat_template, add_generation_prompt=False,
                               continue_final_message=True, **tok.special_tokens)
    assert ours == (hf[0][0] if isinstance(hf, tuple) else hf[0])
    assert ours.rstrip().endswith(begun.strip())  # the end of turn after it is gone
    assert not ours.endswith(tok.apply_chat_template(conv, add_generation_prompt=False)[-5:])


def test_chat_continues_the_final_message(embedded_llm):
    """The output continues the begun answer: the tokens of generate() on the open conversation."""
    tok, greedy = embedded_llm.tokenizer, SamplingParams(temperature=0, max_tokens=24)
    conv = [USER, {"role": "assistant", "content": "def add("}]
    got = embedded_llm.chat(conv, greedy, add_generation_prompt=False, continue_final_message=True)[0]
    text = tok.apply_chat_template(conv, add_generation_prompt=False, continue_final_message=True)
    want = embedded_llm.generate([tok.encode(text, add_special_tokens=False)], greedy)[0]
    assert got.prompt_token_ids == want.prompt_token_ids and got.outputs[0].token_ids == want.outputs[0].token_ids
    fresh = embedded_llm.chat([USER], greedy)[0]
    assert fresh.outputs[0].token_ids != got.outputs[0].token_ids  # the prefill steered it


@pytest.mark.parametrize("kw, conv, words", [
    (dict(continue_final_message=True), [USER], "needs add_generation_prompt=False"),
    (dict(continue_final_message=True, add_generation_prompt=False), [USER, {"role": "assistant", "content": " "}],
     "the last message needs text content"),
])
def test_refused_in_one_line(embedded_llm, kw, conv, words):
    with pytest.raises(ValueError, match=words):
        embedded_llm.chat(conv, SamplingParams(max_tokens=2), **kw)


TEMPLATE = ("{% for m in messages %}[{{ m.role }}{% if mood %} ({{ mood }}){% endif %}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


def test_a_template_in_place_of_the_models_own_from_a_file_or_its_text(tmp_path, embedded_llm):
    """LLM(chat_template=...) (the --chat-template flag): chats render with it, as a file or as text;
    chat_template_kwargs set the template's own variables."""
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE)
    greedy = SamplingParams(temperature=0, max_tokens=4)
    for given in (str(path), TEMPLATE):
        llm = LLM(chat_template=given, kv_cache_gib=0.05)
        out = llm.chat([USER], greedy)[0]
        assert out.prompt_token_ids == llm.tokenizer.encode(f"[user] {USER['content']}\n[assistant] ", add_special_tokens=False)
    moody = llm.chat([USER], greedy, chat_template_kwargs={"mood": "terse"})[0]
    assert llm.tokenizer.decode(moody.prompt_token_ids).startswith("[user (terse)] ")
    assert embedded_llm.tokenizer.chat_template != TEMPLATE  # the other LLM keeps the model's own
    with pytest.raises(ValueError, match="chat_template_kwargs: messages is set by its own argument"):
        llm.chat([USER], greedy, chat_template_kwargs={"messages": []})


@pytest.mark.parametrize("given, words", [("{% for %}", "chat_template: not a Jinja template"),
                                          ("/no/such/template.jinja", "no such file, and not a template")])
def test_a_bad_template_is_refused_in_one_line(given, words):
    with pytest.raises(ValueError, match=words) as e:
        LLM(chat_template=given, kv_cache_gib=0.05)
    assert "\n" not in str(e.value)
