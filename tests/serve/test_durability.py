"""`etude serve --model tiny` as a real subprocess with the real tiny model: the openai client
against it, then `kill -9` under load and a restart: every request that got a 200 has its record.
Runs on both backends: SQLite, and a real PostgreSQL server (tests/db_fixtures.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from etude.store import open_store

ETUDE = [sys.executable, "-c", "from etude.cli import main; main()"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(db: str, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "ETUDE_DB": db}
    proc = subprocess.Popen([*ETUDE, "serve", "--model", "tiny", "--port", str(port), "--threads", "1"], env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("server did not come up")


def _fire(base: str, key: str, stop: threading.Event, acked: list[tuple[str, str]], i: int) -> None:
    c = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=30)
    n = 0
    while not stop.is_set():
        msg = f"worker {i} request {n}"
        try:
            r = c.chat.completions.create(model="auto", messages=[{"role": "user", "content": msg}], max_tokens=4,
                                          user=f"user{i}")
        except (openai.APIConnectionError, openai.APIStatusError, httpx.HTTPError):
            return  # the server is gone: this request was never acknowledged
        acked.append((r.id, msg))
        n += 1


@pytest.mark.slow
def test_tiny_model_over_openai_client_and_kill_9_loses_no_acknowledged_record(tmp_path, db_url):
    db = db_url
    key = open_store(db).create_key("acme")
    port = _free_port()
    base = f"http://127.0.0.1:{port}/v1"
    log = tmp_path / "serve.log"
    proc = _start(db, port, log)
    try:
        c = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
        tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
        r = c.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}], tools=tools,
                                      max_tokens=6, temperature=1.0)
        assert r.model == "tiny" and r.usage.completion_tokens <= 6 and r.usage.prompt_tokens > 20
        rec = open_store(db).interaction("acme", r.id)
        assert len(rec["logprobs"]) == len(rec["completion_token_ids"]) == r.usage.completion_tokens
        assert all(lp <= 0 for lp in rec["logprobs"])
        pieces = list(c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=12, temperature=1.0, stream=True))
        assert pieces[-1].choices[0].finish_reason in ("stop", "length")
        content = [p.choices[0].delta.content for p in pieces if p.choices and p.choices[0].delta.content]
        streamed = open_store(db).interaction("acme", pieces[0].id)
        assert "".join(content) == streamed["response"]["content"]
        if streamed["completion_tokens"] > 3:  # incremental: text arrived in several chunks, as sampled
            assert len(content) > 2
        assert streamed["ttft_s"] <= streamed["latency_s"]
        # the same prompt twice: two independent samples (each batch gets its own logged seed)
        twice = [c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "same"}], max_tokens=6,
                                           temperature=1.0).id for _ in range(2)]
        recs = [open_store(db).interaction("acme", i) for i in twice]
        assert recs[0]["params"]["batch_seed"] != recs[1]["params"]["batch_seed"]
        assert recs[0]["completion_token_ids"] != recs[1]["completion_token_ids"]

        stop, acked = threading.Event(), []
        workers = [threading.Thread(target=_fire, args=(base, key, stop, acked, i)) for i in range(6)]
        for w in workers:
            w.start()
        deadline = time.time() + 60
        while len(acked) < 15 and time.time() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # mid-way: requests are in flight
        proc.wait(timeout=10)
        stop.set()
        for w in workers:
            w.join(timeout=30)
        assert len(acked) >= 15
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    snapshot = list(acked)
    proc = _start(db, port, log)  # restart on the same database
    try:
        store = open_store(db)
        for iid, msg in snapshot:
            assert store.interaction("acme", iid)["messages"][0]["content"] == msg
        again = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
        assert again.chat.completions.create(model="auto", messages=[{"role": "user", "content": "back"}],
                                             max_tokens=2).model == "tiny"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
