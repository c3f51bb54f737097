"""Policies: the scripted fake, the registry, and the OpenAI-compatible client against a real
HTTP server on loopback that answers with canned chat-completions responses."""

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from etude.errors import EtudeError
from etude.harness import run_agent
from etude.harness.agent import edit_feedback
from etude.policy import make_policy
from etude.policy.openai_http import OpenAIPolicy, to_openai_messages
from etude.policy.scripted import ScriptedPolicy
from etude.types import Generation, Message, ToolCall


def test_scripted_outputs_then_final():
    pol = ScriptedPolicy(["a", Generation(text="b"), {"text": "c", "tool_calls": [{"name": "grep", "arguments": {"pattern": "x"}}]}], final="end")
    gens = [pol.generate([], []) for _ in range(5)]
    assert [g.text for g in gens] == ["a", "b", "c", "end", "end"]
    assert gens[0].tool_calls is None and gens[2].tool_calls[0].name == "grep"
    assert all(g.policy_id == "scripted" for g in gens)
    with pytest.raises(RuntimeError, match="boom"):
        ScriptedPolicy([{"raise": "boom"}]).generate([], [])


def test_registry():
    assert isinstance(make_policy("scripted", outputs=["x"]), ScriptedPolicy)
    with pytest.raises(EtudeError, match="unknown policy"):
        make_policy("gpt-17")


def test_registry_imports_backends_lazily():
    code = "import sys, etude.policy; print(any(m in sys.modules for m in ('torch', 'openai', 'etude.policy.local')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_text_format_tool_results_become_user_messages_for_the_api():
    msgs = [Message("user", "q"), Message("assistant", "<tool_call>{}</tool_call>"), Message("tool", "out", tool_call_id="call_0_0", name="grep"),
            Message("assistant", "", tool_calls=(ToolCall("n1", "grep", {"pattern": "x"}),)), Message("tool", "out2", tool_call_id="n1", name="grep")]
    api = to_openai_messages(msgs)
    assert api[2] == {"role": "user", "content": "<tool_response>\nout\n</tool_response>"}
    assert api[3]["tool_calls"][0]["function"] == {"name": "grep", "arguments": '{"pattern": "x"}'}
    assert api[4] == {"role": "tool", "tool_call_id": "n1", "content": "out2"}


# ---------------------------------------------------------------- a loopback chat-completions server


class _Server:
    def __init__(self, replies):
        self.replies, self.requests = list(replies), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization"),
                                       "x": self.headers.get("X-Test")})
                if self.path.endswith("/feedback"):
                    status, payload = 200, {"id": "fb-1", **body}
                else:
                    status, payload = outer.replies.pop(0) if outer.replies else (200, _resp("done"))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _resp(content, tool_calls=None, logprobs=None, finish="stop", id="chatcmpl-1"):
    msg = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    choice = {"index": 0, "message": msg, "finish_reason": finish}
    if logprobs:
        choice["logprobs"] = {"content": [{"token": f"t{i}", "logprob": lp, "bytes": None, "top_logprobs": []} for i, lp in enumerate(logprobs)]}
    return {"id": id, "object": "chat.completion", "created": 0, "model": "m", "choices": [choice],
            "usage": {"prompt_tokens": 120, "completion_tokens": 7, "total_tokens": 127}}


def _tc(id, name, args):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": args}}


@pytest.fixture
def server():
    servers = []

    def make(replies):
        servers.append(_Server(replies))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_openai_policy_generation(server):
    srv = server([(200, _resp("Looking.", [_tc("c1", "read_file", '{"path": "a.py"}'), _tc("c2", "grep", "{'x'}")], logprobs=[-0.1, -2.0], finish="tool_calls"))])
    pol = OpenAIPolicy(srv.url, "m", api_key="k-test", extra_headers={"X-Test": "yes"}, logprobs=True, max_retries=0)
    gen = pol.generate([Message("user", "hi")], [{"type": "function", "function": {"name": "read_file", "parameters": {}}}], max_tokens=33, temperature=0.0)
    assert gen.text == "Looking." and [c.id for c in gen.tool_calls] == ["c1"]
    assert len(gen.tool_call_errors) == 1 and "grep" in gen.tool_call_errors[0]
    assert (gen.prompt_tokens, gen.completion_tokens) == (120, 7) and gen.logprobs == (-0.1, -2.0)
    assert gen.finish_reason == "tool_calls" and gen.latency_s > 0 and gen.policy_id == "m"
    req = srv.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer k-test" and req["x"] == "yes"
    assert req["body"]["max_tokens"] == 33 and req["body"]["temperature"] == 0.0 and req["body"]["logprobs"] is True
    assert req["body"]["tools"][0]["function"]["name"] == "read_file"


def test_openai_policy_drives_the_loop(server, ctx):
    srv = server([
        (200, _resp("", [_tc("c1", "read_file", '{"path": "pkg/a.py"}'), _tc("c2", "list_dir", '{"path": "pkg"')])),
        (200, _resp("f returns 1.")),
    ])
    t = run_agent(OpenAIPolicy(srv.url, "m", max_retries=0), "what does f return?", ctx)
    assert t.stop_reason == "answer" and t.final_message == "f returns 1."
    assert (t.prompt_tokens, t.completion_tokens, t.meta["token_counts"]) == (240, 14, "usage")
    assert t.turns[0].parse_errors and t.broken_calls == 1
    second = srv.requests[1]["body"]["messages"]
    assert second[2]["tool_calls"][0]["id"] == "c1" and len(second[2]["tool_calls"]) == 1  # the malformed call is not echoed
    assert second[3]["role"] == "tool" and second[3]["tool_call_id"] == "c1" and "return 1" in second[3]["content"]
    assert second[4]["role"] == "user" and "list_dir" in second[4]["content"]
    assert "<tools>" not in second[0]["content"]  # native tools: schemas go in `tools`, not in the prompt


def test_http_error_ends_episode_with_a_clear_error(server, ctx):
    srv = server([(500, {"error": {"message": "model overloaded", "type": "server_error"}})])
    t = run_agent(OpenAIPolicy(srv.url, "m", max_retries=0), "go", ctx)
    assert t.stop_reason == "error" and "HTTP 500" in t.meta["error"] and "model overloaded" in t.meta["error"]


def test_unreachable_server_is_an_etude_error():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EtudeError, match="cannot reach the model server"):
        OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "m", max_retries=0, timeout_s=5).generate([Message("user", "hi")], [])


def test_edit_feedback_reports_persistence_on_the_editing_interaction(server, ctx, ws, tmp_path):
    """The `etude agent-feedback` path: the agent's edit, measured later in the repo, reported to the server."""
    edit = '{"path": "pkg/a.py", "old_str": "return 1", "new_str": "return compute_the_answer()"}'
    srv = server([(200, _resp("", [_tc("c1", "edit_file", edit)], id="int-1")), (200, _resp("Done.", id="int-2"))])
    path = tmp_path / "t.jsonl"
    run_agent(OpenAIPolicy(srv.url, "m", max_retries=0), "go", ctx, trajectory_path=path,
              meta={"repo": str(ws), "base_url": srv.url, "session_id": "s-1"})
    kept = edit_feedback(path, send=False)
    assert kept["score"] == 1.0 and kept["reverted"] is False and kept["reported"] == []
    (ws / "pkg" / "a.py").write_text("def f():\n    return 1\n")  # the user reverted it
    out = edit_feedback(path, api_key="k1")
    assert out["score"] < 0.5 and out["reverted"] is True
    sent = srv.requests[-1]
    assert sent["path"] == "/v1/feedback" and sent["auth"] == "Bearer k1"
    assert [r["path"] for r in srv.requests].count("/v1/feedback") == 1  # only the turn that edited
    assert sent["body"]["interaction_id"] == "int-1" and sent["body"]["kind"] == "edit_persistence"
    assert sent["body"]["value"] == out["score"] and out["reported"][0]["id"] == "fb-1"
