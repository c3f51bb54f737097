"""Native text tool-call formats of the model families etude is brought (issue 49 item 2): Mistral's
`[TOOL_CALLS]` and Llama 3.x's JSON, beside Hermes `<tool_call>`. Each is read with the same
guarantee (a call or one error the model sees, never an exception), chosen from the model's chat
template, taught by the tools block, written back for the model's own past turns, and kept through
decoding when the tag is a special token."""

import json

import pytest

from etude.harness import HarnessConfig, run_agent
from etude.harness.prompt import render_tools_prompt
from etude.policy.local import decode_reply, encode_conversation, render_messages
from etude.policy.models import smollm2_tokenizer
from etude.policy.scripted import ScriptedPolicy
from etude.toolcalls import (
    TEXT_FORMATS,
    parse_output,
    render_calls,
    template_format,
    text_format_of,
    writes_calls,
)
from etude.types import Message, ToolCall

MISTRAL_TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}{% if m.tool_calls %}[TOOL_CALLS]"
                    "{{ m.tool_calls | map(attribute='function') | list | tojson }}{% endif %}<|im_end|>{% endfor %}")
LLAMA3_TEMPLATE = ("{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}"
                   "<|eot_id|>{% endfor %}{# tools: <|python_tag|>{\"name\": ..., \"parameters\": ...} #}")


def test_mistral_list_and_named_forms():
    res = parse_output('Let me look.[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "a.py"}}, '
                       '{"name": "grep", "arguments": {"pattern": "x"}}]', "mistral")
    assert res.text == "Let me look." and not res.errors
    assert [(c.id, c.name, c.arguments) for c in res.tool_calls] == [
        ("call_0", "read_file", {"path": "a.py"}), ("call_1", "grep", {"pattern": "x"})]
    res = parse_output('[TOOL_CALLS]read_file[ARGS]{"path": "a.py"}[TOOL_CALLS]grep[CALL_ID]a1B2c3D4e[ARGS]'
                       '{"pattern": "x"}', "mistral")
    assert [(c.id, c.name) for c in res.tool_calls] == [("call_0", "read_file"), ("a1B2c3D4e", "grep")]


@pytest.mark.parametrize("text, says", [
    ('[TOOL_CALLS]read_file[ARGS]{"path": "a.py",}', "trailing comma"),
    ('[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "a.py"}', "invalid JSON"),
    ("[TOOL_CALLS]", "nothing after it"),
    ('[TOOL_CALLS][{"arguments": {}}]', 'missing "name"'),
    ('[TOOL_CALLS][{"name": "rm_rf", "arguments": {}}]', "unknown tool 'rm_rf'"),
])
def test_a_broken_mistral_call_is_one_error(text, says):
    res = parse_output(text, "mistral", tools=["read_file", "grep"])
    assert not res.tool_calls and len(res.errors) == 1 and says in res.errors[0]


def test_llama3_json_calls_and_text():
    res = parse_output('<|python_tag|>{"name": "read_file", "parameters": {"path": "a.py"}}; '
                       '{"name": "grep", "arguments": {"pattern": "x"}}', "llama3_json")
    assert [(c.name, c.arguments) for c in res.tool_calls] == [("read_file", {"path": "a.py"}), ("grep", {"pattern": "x"})]
    assert parse_output('{"name": "grep", "parameters": {"pattern": "x"}}', "llama3_json").tool_calls[0].name == "grep"
    plain = parse_output("The bug is in `f` {see line 3}.", "llama3_json")
    assert plain.text == "The bug is in `f` {see line 3}." and not plain.tool_calls and not plain.errors
    broken = parse_output('{"name": "read_file", "parameters": {"path": "a.py"}', "llama3_json")
    assert not broken.tool_calls and len(broken.errors) == 1 and "invalid JSON" in broken.errors[0]


@pytest.mark.parametrize("fmt", TEXT_FORMATS)
def test_each_format_round_trips_what_it_renders(fmt):
    calls = [ToolCall("x", "read_file", {"path": "a.py"}), ToolCall("y", "grep", {"pattern": "\"q\""})]
    text = render_calls(calls, fmt)
    assert writes_calls(text, fmt)
    res = parse_output(text, fmt)
    assert [(c.name, c.arguments) for c in res.tool_calls] == [(c.name, c.arguments) for c in calls] and not res.errors


def test_the_template_says_the_format():
    assert template_format(MISTRAL_TEMPLATE) == "mistral"
    assert template_format(LLAMA3_TEMPLATE) == "llama3_json"
    assert template_format(smollm2_tokenizer().chat_template) == "hermes"
    assert template_format(None) == "hermes"


def test_the_tools_block_teaches_each_format():
    schema = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                                "parameters": {"type": "object", "properties": {}}}}]
    assert "<tool_call>" in render_tools_prompt(schema)
    assert "[TOOL_CALLS][{" in render_tools_prompt(schema, fmt="mistral")
    assert '"parameters"' in render_tools_prompt(schema, fmt="llama3_json")


@pytest.fixture(scope="module")
def mistral_tok():
    tok = smollm2_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})  # a control token, as in Mistral's
    tok.chat_template = MISTRAL_TEMPLATE
    return tok


def test_decoding_keeps_the_tag_a_mistral_tokenizer_marks_special(mistral_tok):
    text = '[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "a.py"}}]'
    ids = mistral_tok(text, add_special_tokens=False)["input_ids"] + [mistral_tok.convert_tokens_to_ids("<|im_end|>")]
    assert mistral_tok.decode(ids, skip_special_tokens=True).startswith('[{"name"')  # what plain decoding loses
    assert decode_reply(mistral_tok, ids) == text  # the tag kept, the end-of-turn token dropped
    assert parse_output(decode_reply(mistral_tok, ids), text_format_of(mistral_tok)).tool_calls[0].name == "read_file"
    hermes = smollm2_tokenizer()
    ids = hermes("<tool_call>x</tool_call>", add_special_tokens=False)["input_ids"] + [hermes.eos_token_id]
    assert decode_reply(hermes, ids) == hermes.decode(ids, skip_special_tokens=True)


def test_the_models_own_structured_calls_are_rendered_in_its_format(mistral_tok):
    turn = Message(role="assistant", content="", tool_calls=(ToolCall("c1", "read_file", {"path": "a.py"}),))
    assert render_messages([turn], "mistral")[0]["content"] == '[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "a.py"}}]'
    assert render_messages([turn])[0]["content"].startswith("<tool_call>")
    ids = encode_conversation(mistral_tok, [Message("user", "go"), turn])
    assert "[TOOL_CALLS]" in mistral_tok.decode(ids)


def test_an_episode_in_the_mistral_format(ctx, mistral_tok):
    class MistralScripted(ScriptedPolicy):
        tokenizer = mistral_tok  # `auto` finds the format in the policy's chat template

    reply = '[TOOL_CALLS]' + json.dumps([{"name": "read_file", "arguments": {"path": "pkg/a.py"}}])
    for pol, cfg in ((MistralScripted([reply, "It returns 1."]), HarnessConfig()),
                     (ScriptedPolicy([reply, "It returns 1."]), HarnessConfig(tool_format="mistral"))):
        t = run_agent(pol, "What does f return?", ctx, cfg)
        assert "[TOOL_CALLS]" in pol.seen[0][0].content and "<tool_call>" not in pol.seen[0][0].content
        assert t.turns[0].tool_executions[0].call.name == "read_file" and t.turns[0].tool_executions[0].result.ok
        assert t.broken_calls == 0 and t.final_message == "It returns 1." and t.meta["tool_format"] == "mistral"
    # the same reply to a <tool_call> model is text, not a call: the format is the model's, not a guess
    t = run_agent(ScriptedPolicy([reply]), "What does f return?", ctx)
    assert not t.turns[0].tool_executions and t.meta["tool_format"] == "hermes"
