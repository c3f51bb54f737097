"""Adapter ids are immutable and versioned (issue 32 item 1): an organisation's adapter swapped
twice on the real server (uvicorn on loopback, a real SQLite store) — every logged interaction
names the adapter version whose weights produced it.

Regression: `etude specialise --register` registered the adapter directory itself, which the
next run rewrites in place, and every adapter at version 0. After a swap and a rollback the
server reloaded the old name from that directory and served the new weights under the old name
(the stale-adapter bug of vllm RFC #48312, the other way round), logged as the same version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from etude.errors import EtudeError
from etude.serve import registry
from tests.serve.conftest import ScriptedServePolicy, start_server

WEIGHTS = "adapter_model.safetensors"


class WeightsPolicy(ScriptedServePolicy):
    """Answers with the weights it was loaded with: the file is read once, at load, as a real loader does."""

    def __init__(self, cp: Any):
        super().__init__(id=cp.name, version=cp.version)
        f = Path(cp.path) / WEIGHTS
        self.weights = f.read_text() if f.is_file() else "base"  # the shared "fake" production

    def _answer(self, messages: Any) -> str:
        return f"weights {self.weights}"


def write_adapter(d: Path, weights: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "fake", "r": 4}))
    (d / WEIGHTS).write_text(weights)
    return d


@pytest.fixture
def srv(tmp_path: Path) -> Any:
    # max_loaded=1: every swap evicts the previous checkpoint, so going back reloads it from disk
    running, server, th = start_server(tmp_path / "srv", loader=WeightsPolicy, max_loaded=1)
    yield running
    server.should_exit = True
    th.join(timeout=10)


def _ask(srv: Any, key: str, n: int, model: str = "auto") -> list[httpx.Response]:
    out = []
    for i in range(n):
        r = httpx.post(f"{srv.base_url}/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                       json={"model": model, "user": f"u{i}", "messages": [{"role": "user", "content": "fix it"}]})
        out.append(r)
    return out


def test_an_orgs_adapter_swapped_twice_logs_the_version_that_answered(srv: Any, tmp_path: Path) -> None:
    store, key = srv.store, srv.key("acme")
    run = tmp_path / "specialise" / "acme"  # one `etude specialise` output folder, run twice
    v1 = registry.register_adapter(store, "acme", write_adapter(run / "adapter", "one"), run / "adapters",
                                   meta={"base": "fake", "kind": "specialised"})
    registry.promote(store, v1.name, "first adapter")
    first = _ask(srv, key, 3)
    write_adapter(run / "adapter", "two")  # the second run rewrites the same folder in place
    v2 = registry.register_adapter(store, "acme", run / "adapter", run / "adapters",
                                   meta={"base": "fake", "kind": "specialised"})
    assert v2.name != v1.name and (v1.version, v2.version) == (1, 2) and v2.path != v1.path
    assert registry.register_adapter(store, "acme", run / "adapter", run / "adapters") == v2  # same files: same id
    with pytest.raises(EtudeError, match="already registered"):  # a name is never reused for other weights
        registry.register_checkpoint(store, v1.name, str(run / "adapter"), org="acme")
    registry.promote(store, v2.name, "second adapter")
    second = _ask(srv, key, 3)
    registry.rollback(store, v2.name, reason="back to the first")  # v1 is reloaded from disk (max_loaded=1)
    third = _ask(srv, key, 3)

    answered = {v1.name: "weights one", v2.name: "weights two"}
    for batch, cp in ((first, v1), (second, v2), (third, v1)):
        for r in batch:
            assert r.status_code == 200, r.text
            assert r.headers["x-etude-checkpoint"] == cp.name
            assert r.json()["choices"][0]["message"]["content"] == answered[cp.name]
    logged = store.interactions(org="acme")
    assert len(logged) == 9
    for rec in logged:  # every record names the version whose weights produced its answer
        cp = registry.get_checkpoint(store, rec["checkpoint"])
        assert rec["policy_version"] == cp.version
        assert rec["response"]["content"] == answered[cp.name] == f"weights {(Path(cp.path) / WEIGHTS).read_text()}"
    assert [r["checkpoint"] for r in sorted(logged, key=lambda r: r["created_at"])] == [v1.name] * 3 + [v2.name] * 3 + [v1.name] * 3


def test_an_adapter_rewritten_after_registration_is_refused_not_served(srv: Any, tmp_path: Path) -> None:
    store, key = srv.store, srv.key("acme")
    d = write_adapter(tmp_path / "by-hand", "one")
    cp = registry.register_checkpoint(store, "acme-by-hand", str(d), org="acme", version=4)
    assert cp.meta["sha256"] == registry.adapter_digest(d)
    write_adapter(d, "two")  # rewritten in place under the registered name
    before = registry.list_checkpoints(store, "acme")
    r = _ask(srv, key, 1, model="acme-by-hand")[0]
    assert r.status_code == 503, r.text
    msg = r.json()["error"]["message"]
    assert "changed since it was registered" in msg and "\n" not in msg
    assert store.interactions(org="acme") == [] and registry.list_checkpoints(store, "acme") == before
    assert _ask(srv, key, 1)[0].status_code == 200  # production keeps serving
