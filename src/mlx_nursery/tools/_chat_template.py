"""The ChatML/Qwen-style chat template written into factory-made models.

It renders system/user/assistant/tool roles, tool definitions and assistant
tool calls in the `<tool_call>` JSON format that mlx-lm's `json_tools` parser
reads back. OpenAI clients send tool-call arguments as a JSON *string*: the
template emits a string as-is and only JSON-encodes a mapping, so arguments are
never encoded twice. `CHAT_TEMPLATE` has no `<think>` handling on purpose (mlx-lm passes
`enable_thinking` to every template when `<think>` is in the vocabulary; offline-models.md);
the thinking presets' templates are built from it (`thinking_template`).
"""

CHAT_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages and messages[0].role == 'system' %}"
    "{{ messages[0].content }}{{ '\\n' }}{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    "<|im_end|>\n"
    "{% elif messages and messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' and loop.first %}"
    "{% elif message.role in ['user', 'system'] %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}"
    "<|im_start|>assistant\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% if message.tool_calls %}"
    "{% for tc in message.tool_calls %}"
    "{% if tc.function is defined %}{% set tool_call = tc.function %}"
    "{% else %}{% set tool_call = tc %}{% endif %}"
    "{% if message.content or not loop.first %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": "{{ tool_call.name }}", "arguments": '
    "{% if tool_call.arguments is string %}{{ tool_call.arguments }}"
    "{% else %}{{ tool_call.arguments | tojson }}{% endif %}"
    "}\n</tool_call>"
    "{% endfor %}"
    "{% endif %}"
    "<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


_CONTENT_MACRO = (
    "{% macro render(content) %}"
    "{% if content is string %}{{ content }}"
    "{% elif content %}{% for part in content %}"
    "{% if part.type in ['image', 'image_url', 'input_image'] %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part.text is defined %}{{ part.text }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% endmacro %}"
)

VISION_CHAT_TEMPLATE = _CONTENT_MACRO + CHAT_TEMPLATE.replace(
    "{{ messages[0].content }}", "{{ render(messages[0].content) }}"
).replace("{{ message.content }}", "{{ render(message.content) }}")
"""`CHAT_TEMPLATE` for Qwen2-VL-like models: content may be a list of parts, and an image
part becomes Qwen2-VL's `<|vision_start|><|image_pad|><|vision_end|>` (the processor then
repeats the pad once per image token)."""


_LAST_USER = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}"
    "{% endif %}{% endfor %}"
)
_ASSISTANT_CONTENT = "{% if message.content %}{{ message.content }}{% endif %}"
_ASSISTANT_WITH_REASONING = (
    # As Qwen3's: the reasoning of the turns after the last user message is shown again
    # (a tool-calling turn's), earlier turns' is dropped.
    "{% if message.reasoning_content and loop.index0 > ns.last_user %}"
    "<think>\n{{ message.reasoning_content.strip('\n') }}\n</think>\n\n{% endif %}"
    + _ASSISTANT_CONTENT
)
_GENERATION_PROMPT = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
_NO_THINKING = "{% if enable_thinking is defined and enable_thinking is false %}"


def thinking_template(opens: bool) -> str:
    """`CHAT_TEMPLATE` as a thinking model's (Qwen3-style): earlier reasoning rendered back
    after the last user message, and `enable_thinking=false` an empty think block in the
    prompt. `opens`: the prompt also opens the think block when thinking is on, so the output
    begins mid-thought (Qwen3.5, DeepSeek-R1-0528); otherwise the model opens it (Qwen3)."""
    thinking = "{% else %}<think>\n{% endif %}" if opens else "{% endif %}"
    prompt = (
        "{% if add_generation_prompt %}<|im_start|>assistant\n"
        + _NO_THINKING
        + "<think>\n\n</think>\n\n"
        + thinking
        + "{% endif %}"
    )
    template = CHAT_TEMPLATE.replace(_ASSISTANT_CONTENT, _ASSISTANT_WITH_REASONING)
    template = template.replace(_GENERATION_PROMPT, prompt)
    assert _ASSISTANT_WITH_REASONING in template and prompt in template
    return _LAST_USER + template
