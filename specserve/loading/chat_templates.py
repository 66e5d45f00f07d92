"""Chat templates for GGUF files that carry none (`tokenizer.chat_template` absent), by architecture,
as llama.cpp falls back to its built-in templates (llama-chat.cpp). Rendered with the tokenizer's
special tokens (bos_token, eos_token) and add_generation_prompt."""

# Gemma 3: no system role; a system message is folded into the first user turn (Google's template).
GEMMA = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

BUILTIN = {"gemma3": GEMMA, "gemma2": GEMMA, "gemma": GEMMA}
