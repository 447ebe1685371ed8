"""Chat templates that carry tool turns: what multi-turn episodes need of a tokenizer.

An episode's conversation holds the policy's turns with ``<tool_call>`` blocks and
``role: tool`` results. The starter ships a plain ChatML template (every message is
its role and its content), which renders a tool result as a ``tool`` turn and cannot
render structured ``tool_calls``; TRL's multi-turn GRPO refuses such a template.
``TOOL_CHATML_TEMPLATE`` is the same ChatML for system, user and assistant text (so a
single-turn prompt renders token for token as before) plus Qwen's tool layout: an
assistant's structured ``tool_calls`` as ``<tool_call>`` blocks, a tool result as a
user turn holding ``<tool_response>``. TRL also needs to parse calls back out of
generated text: ``response_template`` (TRL's Qwen3 schema: ``<tool_call>`` JSON blocks
after the assistant header) is set on the tokenizer with it.
"""

from __future__ import annotations

from typing import Any

from posttrain.errors import PosttrainError

#: the starters' own template: every message as ``<|im_start|>role\ncontent<|im_end|>``
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TOOL_CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content']"
    " + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{%- if message.get('tool_calls') %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- if call.function is defined %}{%- set call = call.function %}{%- endif %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": '"
    " + (call.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_PROBE = [
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "probe_tool",
                                                      "arguments": {"x": 1}}}]},
    {"role": "tool", "name": "probe_tool", "content": "probe_result"},
]


def renders_tool_turns(tokenizer: Any) -> bool:
    """Does the tokenizer's chat template render structured tool calls and tool results?"""
    try:
        text = tokenizer.apply_chat_template(_PROBE, tokenize=False)
    except Exception:  # a template may raise on roles it does not know
        return False
    return "probe_tool" in text and "probe_result" in text


def _is_plain_chatml(tokenizer: Any) -> bool:
    """The starter's template: every message as ``<|im_start|>role\\ncontent<|im_end|>``."""
    return tokenizer.chat_template == CHATML_TEMPLATE


def enable_tool_turns(tokenizer: Any, name: str = "the model") -> Any:
    """Make ``tokenizer`` ready for episodes: a template that renders tool turns and a
    ``response_template`` TRL parses calls with. A plain ChatML template is swapped for
    ``TOOL_CHATML_TEMPLATE``; a template that already renders tool turns is kept.
    Raises ``PosttrainError`` for any other template (naming what to do)."""
    if not renders_tool_turns(tokenizer):
        if not _is_plain_chatml(tokenizer):
            raise PosttrainError(
                f"{name}'s chat template cannot render tool calls and tool results, which a "
                "multi-turn environment needs: use a tool-calling chat model (Qwen2.5/Qwen3 "
                "instruct) or the starter")
        tokenizer.chat_template = TOOL_CHATML_TEMPLATE
    if getattr(tokenizer, "response_template", None) is None and getattr(
            tokenizer, "response_schema", None) is None:
        from trl.chat_template_utils import qwen3_template

        tokenizer.response_template = qwen3_template
    return tokenizer
