"""Writes parse_corpus.jsonl (run from the repository root). Edit the cases here, then rerun.

Each case: the model output, the format, and what the parser must return: the calls (name and
arguments), one substring per expected error (count must match), optionally the exact free
text and the call ids.
"""

import json

TC, CT = "<tool_call>", "</tool_call>"
C = []


def blk(obj_text):
    return f"{TC}\n{obj_text}\n{CT}"


def j(name, **args):
    return json.dumps({"name": name, "arguments": args})


def case(id, input, calls=(), errors=(), text=None, format="auto", tools=None, ids=None):
    expect = {"calls": [{"name": n, "arguments": a} for n, a in calls], "errors": list(errors)}
    if text is not None:
        expect["text"] = text
    if ids is not None:
        expect["ids"] = ids
    d = {"id": id, "format": format, "input": input, "expect": expect}
    if tools is not None:
        d["tools"] = tools
    C.append(d)


# ---- well-formed hermes
case("single_call", blk(j("read_file", path="a.py")), [("read_file", {"path": "a.py"})], text="")
case("text_and_two_calls", "Let me look.\n" + blk(j("list_dir", path=".")) + "\n" + blk(j("grep", pattern="def total", path=".")) + "\nThen I'll fix it.",
     [("list_dir", {"path": "."}), ("grep", {"pattern": "def total", "path": "."})], text="Let me look.\nThen I'll fix it.", ids=["call_0", "call_1"])
case("three_calls_no_newlines", TC + j("glob", pattern="**/*.py") + CT + TC + j("read_file", path="x.py", start_line=1, end_line=5) + CT + TC + j("run_terminal", command="pytest -q") + CT,
     [("glob", {"pattern": "**/*.py"}), ("read_file", {"path": "x.py", "start_line": 1, "end_line": 5}), ("run_terminal", {"command": "pytest -q"})], text="")
case("arguments_as_json_string", blk(json.dumps({"name": "read_file", "arguments": json.dumps({"path": "b.py"})})), [("read_file", {"path": "b.py"})])
case("no_arguments", blk('{"name": "list_dir"}'), [("list_dir", {})])
case("arguments_null", blk('{"name": "list_dir", "arguments": null}'), [("list_dir", {})])
case("arguments_empty_string", blk('{"name": "list_dir", "arguments": ""}'), [("list_dir", {})])
case("fenced_json_inside_block", f"{TC}\n```json\n{j('grep', pattern='TODO')}\n```\n{CT}", [("grep", {"pattern": "TODO"})], text="")
case("fence_without_language", f"{TC}```\n{j('grep', pattern='x')}\n```{CT}", [("grep", {"pattern": "x"})])
case("block_inside_markdown_fence", "Calling:\n```\n" + blk(j("list_dir", path="src")) + "\n```", [("list_dir", {"path": "src"})], text="Calling:")
case("missing_close_at_end", "I'll read it.\n" + TC + "\n" + j("read_file", path="c.py"), [("read_file", {"path": "c.py"})], text="I'll read it.")
case("missing_close_then_text", TC + j("read_file", path="c.py") + "\nwaiting for the result", [("read_file", {"path": "c.py"})], text="waiting for the result")
case("missing_close_before_next_block", TC + j("read_file", path="a.py") + "\n" + blk(j("read_file", path="b.py")),
     [("read_file", {"path": "a.py"}), ("read_file", {"path": "b.py"})], text="")
case("openai_nested_in_tag", blk(json.dumps({"type": "function", "function": {"name": "grep", "arguments": {"pattern": "x"}}})), [("grep", {"pattern": "x"})])
case("unicode_arguments", blk(json.dumps({"name": "write_file", "arguments": {"path": "é.txt", "content": "naïve — ✓\n"}}, ensure_ascii=False)),
     [("write_file", {"path": "é.txt", "content": "naïve — ✓\n"})])
case("close_tag_inside_string", blk(j("write_file", path="p.md", content="use </tool_call> to end a call")) + " done",
     [("write_file", {"path": "p.md", "content": "use </tool_call> to end a call"})], text="done")
case("escaped_quotes_and_newlines", blk(j("edit_file", path="m.py", old_str='print("a")\n', new_str='print("b")\n')),
     [("edit_file", {"path": "m.py", "old_str": 'print("a")\n', "new_str": 'print("b")\n'})])
case("crlf_and_spaces", "ok\r\n<tool_call>  \r\n  " + j("glob", pattern="*.md") + "  \r\n</tool_call>\r\n", [("glob", {"pattern": "*.md"})], text="ok")
case("plain_answer", "The bug is fixed; all tests pass.", [], text="The bug is fixed; all tests pass.")
case("json_without_tags_is_text", '{"name": "read_file", "arguments": {"path": "a.py"}}', [], text='{"name": "read_file", "arguments": {"path": "a.py"}}')
case("name_with_spaces_trimmed", blk('{"name": " grep ", "arguments": {"pattern": "x"}}'), [("grep", {"pattern": "x"})])
case("known_tools_ok", blk(j("grep", pattern="x")), [("grep", {"pattern": "x"})], tools=["grep", "read_file"])

# ---- malformed hermes
case("trailing_comma", blk('{"name": "grep", "arguments": {"pattern": "x",}}'), [], ["trailing comma"])
case("single_quotes", blk("{'name': 'grep', 'arguments': {'pattern': 'x'}}"), [], ["single quotes"])
case("unescaped_quote_in_code", blk('{"name": "edit_file", "arguments": {"path": "m.py", "old_str": "x == "+"", "new_str": "x"}}'),
     [], ['a " inside a string left unescaped'])
case("missing_name", blk('{"arguments": {"path": "a.py"}}'), [], ['missing "name"'])
case("empty_name", blk('{"name": "", "arguments": {}}'), [], ['missing "name"'])
case("name_not_string", blk('{"name": 7, "arguments": {}}'), [], ['missing "name"'])
case("arguments_list", blk('{"name": "grep", "arguments": ["x"]}'), [], ["arguments must be a JSON object"])
case("arguments_bad_json_string", blk('{"name": "grep", "arguments": "{pattern: x}"}'), [], ["arguments string is not valid JSON"])
case("arguments_string_not_object", blk('{"name": "grep", "arguments": "[1, 2]"}'), [], ["arguments must be a JSON object"])
case("body_is_list", blk('[{"name": "grep"}]'), [], ["expected a JSON object"])
case("body_is_text", blk("read_file a.py"), [], ["invalid JSON"])
case("empty_block", f"{TC}\n\n{CT}", [], ["empty <tool_call> block"])
case("truncated_json_no_close", "Reading.\n" + TC + '\n{"name": "read_file", "arguments": {"path": "a.', [], ["no closing </tool_call>"], text="Reading.")
case("stray_close_tag", j("grep", pattern="x") + CT, [], ["without an opening"])
case("parameters_instead_of_arguments", blk('{"name": "grep", "parameters": {"pattern": "x"}}'), [], ['not "parameters"'])
case("python_literals", blk('{"name": "read_file", "arguments": {"path": "a.py", "end_line": None}}'), [], ["invalid JSON"])
case("json_comment", blk('{"name": "grep", // search\n "arguments": {"pattern": "x"}}'), [], ["invalid JSON"])
case("two_objects_in_one_block", blk(j("grep", pattern="a") + "\n" + j("grep", pattern="b")), [], ["invalid JSON"])
case("good_then_bad_then_good", blk(j("grep", pattern="a")) + blk('{"name": "grep", "arguments": {"pattern": "b",}}') + blk(j("grep", pattern="c")),
     [("grep", {"pattern": "a"}), ("grep", {"pattern": "c"})], ["tool call 2:"], ids=["call_0", "call_2"])
case("unknown_tool_with_tools", blk(j("delete_repo", path=".")), [], ["unknown tool 'delete_repo'"], tools=["grep", "read_file"])
case("unclosed_garbage_before_next", TC + "{oops\n" + blk(j("grep", pattern="z")), [("grep", {"pattern": "z"})], ["no closing </tool_call>"])

# ---- openai JSON
resp = {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": "Looking.", "tool_calls": [
    {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"a.py\"}"}},
    {"id": "call_b", "type": "function", "function": {"name": "grep", "arguments": "{\"pattern\": \"x\",}"}}]}}]}
case("openai_response_one_bad_arguments", json.dumps(resp), [("read_file", {"path": "a.py"})], ["tool call 2: grep: arguments string is not valid JSON"], text="Looking.", ids=["call_a"])
case("openai_message_text_only", json.dumps({"role": "assistant", "content": "All done."}), [], text="All done.")
case("openai_tool_calls_list", json.dumps([{"id": "c1", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}]), [("list_dir", {})], ids=["c1"])
case("openai_missing_function", json.dumps({"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]}), [], ['missing "function"'], text="")
case("openai_missing_name", json.dumps({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"arguments": "{}"}}]}), [], ['missing "name"'])
case("openai_arguments_object", json.dumps({"role": "assistant", "content": "", "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "grep", "arguments": {"pattern": "y"}}}]}), [("grep", {"pattern": "y"})])
case("openai_function_not_object", json.dumps({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": "grep"}]}), [], ['"function" must be an object'])
case("openai_no_choices", json.dumps({"choices": []}), [], ["no choices"])
case("openai_forced_on_text", "just text", [], ["not an OpenAI"], format="openai")
case("hermes_forced_on_json", json.dumps({"role": "assistant", "content": "hi"}), [], format="hermes", text=json.dumps({"role": "assistant", "content": "hi"}))
case("auto_non_openai_json_is_text", '{"a": 1}', [], text='{"a": 1}')
with open("tests/harness/data/parse_corpus.jsonl", "w") as f:
    for c in C:
        f.write(json.dumps(c, ensure_ascii=False) + "\n")
print(len(C))
