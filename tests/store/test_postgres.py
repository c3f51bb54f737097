"""The same store on a real PostgreSQL server (a throwaway cluster started here), so the
"PostgreSQL by URL" claim is tested, not assumed. Skipped where PostgreSQL or psycopg is absent."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from etude.errors import NotFound
from etude.serve import registry as reg
from etude.serve.router import Router
from etude.store import open_store

pytestmark = pytest.mark.slow


def _tool(name: str) -> str | None:
    for d in ("/usr/local/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin"):
        if os.path.exists(f"{d}/{name}"):
            return f"{d}/{name}"
    return shutil.which(name)


def _as_postgres(argv: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; this machine's tests run as root.
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture(scope="module")
def pg_url():
    pytest.importorskip("psycopg")
    initdb, pg_ctl = _tool("initdb"), _tool("pg_ctl")
    if not initdb or not pg_ctl or (os.geteuid() == 0 and not shutil.which("runuser")):
        pytest.skip("no PostgreSQL server binaries here")
    data = tempfile.mkdtemp(prefix="etude-pg-")
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(_as_postgres([initdb, "-D", data, "-A", "trust", "-U", "postgres"]), check=True,
                   capture_output=True, timeout=120)
    subprocess.run(_as_postgres([pg_ctl, "-D", data, "-w", "-l", f"{data}/log", "-o",
                                 f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=on", "start"]),
                   check=True, capture_output=True, timeout=120)
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_postgres([pg_ctl, "-D", data, "-m", "immediate", "stop"]), capture_output=True, timeout=60)
        shutil.rmtree(data, ignore_errors=True)


def _rec(org: str, **kw):
    return {"org_id": org, "checkpoint": "tiny", "policy_version": 1, "prompt_token_ids": [1, 2],
            "completion_token_ids": [3], "logprobs": [-0.25], "messages": [{"role": "user", "content": "hi"}], **kw}


def test_store_keys_interactions_feedback_and_group_commit_on_postgres(pg_url):
    store = open_store(pg_url)
    assert open_store(pg_url).count_interactions("acme") == 0  # second open: already at head
    key = store.create_key("acme")
    assert store.authenticate(key) == "acme"
    iid = store.log_interaction(_rec("acme", created_at=10.0))
    with ThreadPoolExecutor(4) as ex:
        futs = list(ex.map(lambda i: store.submit([("interaction", _rec("acme", created_at=20.0 + i))]), range(12)))
    assert all(f.result(timeout=60) for f in futs)
    assert store.count_interactions("acme") == 13
    assert store.interaction("acme", iid)["logprobs"] == [-0.25]
    with pytest.raises(NotFound):
        store.interaction("globex", iid)
    assert len(store.interactions(org="acme", since=20.0, until=25.0)) == 5
    store.log_feedback({"org_id": "acme", "interaction_id": iid, "kind": "edit_persistence", "value": 0.5})
    with pytest.raises(NotFound):
        store.log_feedback({"org_id": "globex", "interaction_id": iid, "kind": "accept"})
    assert [f["value"] for f in store.feedback(org="acme")] == [0.5]


def test_registry_and_router_on_postgres(pg_url):
    store = open_store(pg_url)
    reg.register_checkpoint(store, "pg-v1", "tiny", state="production", org="pgorg")
    reg.register_checkpoint(store, "pg-v2", "tiny", version=1, org="pgorg")
    reg.set_experiment(store, "pg-exp", [("control", "pg-v1", 0.0), ("canary", "pg-v2", 1.0)], org="pgorg")
    r = Router(store)
    assert r.resolve("pgorg", "auto", "u", "s").checkpoint.name == "pg-v2"
    reg.promote(store, "pg-v2")
    assert reg.rollback(store, org="pgorg").name == "pg-v1"
    assert r.resolve("pgorg", "auto", "u", "s").checkpoint.name == "pg-v1"
