"""Fixtures for the server tests: a scripted policy (the only fake) behind the real app, real
uvicorn on a free loopback port, a real SQLite file."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from etude.types import Generation, Message
from tests.db_fixtures import db_url  # noqa: F401  (test_durability runs on SQLite and PostgreSQL)

TOOL_CALL = '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>'
BROKEN_CALL = '<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>'


class ScriptedServePolicy:
    """Answers by the last user message: 'tool' -> a read_file call, 'broken' -> a malformed
    call, a question -> a clarifying question back, anything else -> 'echo: <message>'. Records every batch it was given."""

    native_tools = False

    def __init__(self, id: str = "fake", version: int = 0, delay_s: float = 0.0):
        self.id, self.version, self.delay_s = id, version, delay_s
        self.batches: list[int] = []
        self.prompts: list[list[Message]] = []

    def _answer(self, messages: Sequence[Message]) -> str:
        last = next((m.content for m in reversed(messages) if m.role == "user"), "")
        if last.endswith("?"):
            return "Which file do you mean?"
        if "broken" in last:
            return BROKEN_CALL
        if "tool" in last:
            return "Let me look. " + TOOL_CALL
        return f"echo: {last}"

    def generate_batch(self, conversations: Sequence[Sequence[Message]], tools: Any = (), *, max_tokens: int = 64,
                       temperature: float = 0.7, **_: Any) -> list[Generation]:
        self.batches.append(len(conversations))
        self.prompts.extend(list(c) for c in conversations)
        if self.delay_s:
            time.sleep(self.delay_s)
        out = []
        for conv in conversations:
            text = self._answer(conv)
            ids = tuple(range(1, min(len(text.split()), max_tokens) + 1))
            out.append(Generation(text=text, prompt_token_ids=(7, 8, 9), token_ids=ids,
                                  logprobs=tuple(-0.5 for _ in ids), policy_id=self.id, policy_version=self.version))
        return out

    def generate(self, messages: Sequence[Message], tools: Any = (), **kw: Any) -> Generation:
        return self.generate_batch([messages], tools, **kw)[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Running:
    base_url: str
    store: Any
    policies: dict[str, ScriptedServePolicy]
    cfg: Any

    def key(self, org: str) -> str:
        return self.store.create_key(org)


def start_server(tmp_path: Any, delay_s: float = 0.0, real_loader: bool = False, loader: Any = None,
                 **cfg_kw: Any) -> tuple[Running, Any, threading.Thread]:
    import uvicorn

    from etude.serve import ServeConfig, build_app
    from etude.store import open_store

    policies: dict[str, ScriptedServePolicy] = {}

    def scripted(cp: Any) -> ScriptedServePolicy:
        pol = ScriptedServePolicy(id=cp.name, version=cp.version, delay_s=delay_s)
        policies[cp.name] = pol
        return pol

    tmp_path.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cfg_kw.setdefault("model", "fake")
    cfg = ServeConfig(port=port, db=f"sqlite:///{tmp_path / 'etude.db'}", **cfg_kw)
    store = open_store(cfg.db)
    if real_loader:
        from etude.serve.pool import load_local

        app = build_app(cfg, store, loader=load_local)
    else:
        app = build_app(cfg, store, loader=loader or scripted)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    return Running(f"{base}/v1", store, policies, cfg), server, th


@pytest.fixture
def server_factory(tmp_path: Any) -> Iterator[Any]:
    """start(**ServeConfig fields, delay_s=...) -> Running; every server is stopped at teardown."""
    started: list[tuple[Any, threading.Thread]] = []

    def start(**kw: Any) -> Running:
        running, srv, th = start_server(tmp_path / f"s{len(started)}", **kw)
        started.append((srv, th))
        return running

    yield start
    for srv, th in started:
        srv.should_exit = True
        th.join(timeout=10)


@pytest.fixture
def server(tmp_path: Any) -> Iterator[Running]:
    running, srv, th = start_server(tmp_path)
    yield running
    srv.should_exit = True
    th.join(timeout=10)
