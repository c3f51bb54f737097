"""`OpenAIPolicy` and the loop against the real `etude serve` (tiny model) on loopback: the
production path of `etude agent --base-url` (session header, usage, interaction ids)."""

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from etude.harness import HarnessConfig, run_agent
from etude.policy.openai_http import OpenAIPolicy
from etude.protocols import ToolContext

pytestmark = pytest.mark.slow


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    env = dict(os.environ, ETUDE_HOME=str(tmp_path / "home"))
    etude = [sys.executable, "-m", "etude.cli"]
    key = subprocess.run([*etude, "keys", "create", "--org", "acme"], env=env, capture_output=True, text=True, check=True).stdout.split()[-1]
    port = _free_port()
    proc = subprocess.Popen([*etude, "serve", "--model", "tiny", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(300):
            if proc.poll() is not None:
                pytest.fail(f"etude serve exited: {proc.stderr.read()[-2000:]}")
            try:
                httpx.get(f"{url}/models", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield url, key
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_agent_loop_against_etude_serve(server, ws):
    url, key = server
    pol = OpenAIPolicy(url, "tiny", api_key=key, extra_headers={"x-etude-session": "agent-test"}, max_retries=0)
    t = run_agent(pol, "read pkg/a.py", ToolContext(workspace=ws), HarnessConfig(max_steps=2, max_tokens_per_turn=8))
    assert t.stop_reason in ("answer", "max_tokens", "max_steps"), t.meta.get("error")
    gen = t.turns[0].generation
    assert gen.response_id and gen.prompt_tokens > 100 and 0 < gen.completion_tokens <= 8
    assert t.meta["token_counts"] == "usage"
    bad = OpenAIPolicy(url, "tiny", api_key="etk_wrong", max_retries=0)
    t2 = run_agent(bad, "x", ToolContext(workspace=ws))
    assert t2.stop_reason == "error" and "HTTP 401" in t2.meta["error"]
