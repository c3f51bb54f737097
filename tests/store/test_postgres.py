"""What only a real PostgreSQL server shows (the server of $ETUDE_TEST_POSTGRES_URL, a fresh
database per test; skipped locally without one, required under CI): the registry and router,
group commit under concurrency, and values SQLite would take but PostgreSQL refuses.
The rest of the store's tests run on both backends (test_store.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from etude.errors import NotFound
from etude.serve import registry as reg
from etude.serve.router import Router
from etude.store import open_store
from tests.db_fixtures import fresh_postgres_database, postgres_server_url


@pytest.fixture
def pg_url():
    with fresh_postgres_database(postgres_server_url()) as url:
        yield url


def _rec(org: str, **kw):
    return {"org_id": org, "checkpoint": "tiny", "policy_version": 1, "prompt_token_ids": [1, 2],
            "completion_token_ids": [3], "logprobs": [-0.25], "messages": [{"role": "user", "content": "hi"}], **kw}


def test_the_store_really_runs_on_postgresql(pg_url):
    store = open_store(pg_url)
    assert store.engine.url.get_backend_name() == "postgresql" and not store.is_sqlite
    with store.read() as conn:
        assert conn.exec_driver_sql("show fsync").scalar() == "on"
        assert conn.exec_driver_sql("show synchronous_commit").scalar() == "on"
    store.close()


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


def test_a_record_postgresql_refuses_fails_only_its_own_caller(pg_url):
    # NUL in text and an over-long varchar: fine in SQLite, errors in PostgreSQL (the server
    # refuses such request bodies before they get here; this is the store's own guarantee)
    store = open_store(pg_url)
    good = store.submit([("interaction", _rec("acme"))])
    nul = store.submit([("interaction", _rec("acme", messages=[{"role": "user", "content": "a\x00b"}]))])
    long = store.submit([("interaction", _rec("acme", messages=[{"role": "tool", "content": "r",
                                                                  "tool_call_id": "c" * 200}]))])
    assert store.interaction("acme", good.result(timeout=60)[0])
    for fut in (nul, long):
        with pytest.raises(Exception):  # noqa: B017 - the driver's own error class
            fut.result(timeout=60)
    assert store.count_interactions("acme") == 1


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
