"""The SQL store on both backends — a real SQLite file and a real PostgreSQL server (a fresh
database each; see tests/db_fixtures.py): migrations, durability, keys, org scoping."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sqlalchemy as sa

from etude.errors import EtudeError, NotFound
from etude.store import open_store, resolve_url
from etude.store import schema as t
from etude.store.engine import current_revision, head_revision
from etude.store.schema import metadata


def _rec(org: str = "acme", **kw):
    base = dict(org_id=org, checkpoint="tiny", policy_version=2, user_id="u", session_id="s",
                prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5], logprobs=[-0.1, -0.2],
                messages=[{"role": "user", "content": "hi"}])
    return {**base, **kw}


@pytest.fixture
def store(db_url):
    s = open_store(db_url)
    yield s
    s.close()


@pytest.fixture
def sqlite_store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    yield s
    s.close()


def test_url_resolution_prefers_argument_then_env_then_etude_home(etude_home, monkeypatch):
    monkeypatch.delenv("ETUDE_DB", raising=False)
    assert resolve_url() == f"sqlite:///{etude_home / 'etude.db'}"
    monkeypatch.setenv("ETUDE_DB", "sqlite:////tmp/x.db")
    assert resolve_url() == "sqlite:////tmp/x.db"
    assert resolve_url("sqlite:////tmp/y.db") == "sqlite:////tmp/y.db"


def test_open_migrates_to_head_and_the_migrated_schema_matches_schema_py(store):
    assert current_revision(store.engine) == head_revision()
    insp = sa.inspect(store.engine)
    for table in metadata.sorted_tables:
        got = {c["name"] for c in insp.get_columns(table.name)}
        assert got == {c.name for c in table.columns}, table.name


def test_sqlite_runs_wal_with_full_sync(sqlite_store):
    with sqlite_store.read() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL


def test_keys_are_stored_hashed_and_authenticate_to_their_org(store):
    key = store.create_key("acme", name="ci")
    assert store.authenticate(key) == "acme"
    assert store.authenticate(key + "x") is None and store.authenticate("garbage") is None
    with store.read() as conn:
        raw = [tuple(r) for r in conn.execute(sa.select(t.api_keys.c.key_hash, t.api_keys.c.id))]
    assert key not in str(raw) and key.split("_", 2)[2] not in str(raw)
    store.revoke_key("acme", key.split("_")[1])
    assert store.authenticate(key) is None
    with pytest.raises(NotFound):
        store.revoke_key("other", key.split("_")[1])
    with pytest.raises(EtudeError):
        store.create_key("bad org!")


def test_interactions_are_scoped_by_org_and_filtered_by_window(store):
    a = store.log_interaction(_rec(created_at=100.0, arm="canary"))
    store.log_interaction(_rec(created_at=200.0, arm="control"))
    store.log_interaction(_rec(org="other", created_at=150.0))
    assert [r["id"] for r in store.interactions(org="acme", until=150)] == [a]
    assert [r["arm"] for r in store.interactions(org="acme")] == ["canary", "control"]
    assert len(store.interactions(org="acme", arm="control", since=150)) == 1
    assert len(store.interactions(org="other")) == 1
    with pytest.raises(NotFound):
        store.interaction("other", a)
    full = store.interaction("acme", a)
    assert full["logprobs"] == [-0.1, -0.2] and full["prompt_tokens"] == 3 and full["messages"][0]["content"] == "hi"


def test_last_in_session_names_the_newest_interaction_and_its_last_user_message(store):
    msgs = [{"role": "user", "content": "fix it"}, {"role": "assistant", "content": "done"},
            {"role": "user", "content": "still broken"}, {"role": "tool", "content": "ok"}]
    store.log_interaction(_rec(created_at=100.0, messages=[{"role": "user", "content": "first"}]))
    b = store.log_interaction(_rec(created_at=200.0, messages=msgs))
    store.log_interaction(_rec(org="other", created_at=300.0))
    store.log_interaction(_rec(created_at=400.0, session_id="s2", messages=[{"role": "system", "content": "x"}]))
    assert store.last_in_session("acme", "s") == (b, "still broken")
    assert store.last_in_session("acme", "s") == (store.last_interaction("acme", "s")["id"], "still broken")
    assert store.last_in_session("acme", "s2")[1] is None  # no user message
    assert store.last_in_session("other", "s2") is None and store.last_in_session("acme", "nope") is None


def test_feedback_only_attaches_to_the_orgs_own_interactions(store):
    a = store.log_interaction(_rec())
    store.log_feedback({"org_id": "acme", "interaction_id": a, "kind": "accept", "value": 1})
    with pytest.raises(NotFound):
        store.log_feedback({"org_id": "other", "interaction_id": a, "kind": "accept"})
    with pytest.raises(EtudeError):
        store.log_feedback({"org_id": "acme", "interaction_id": a, "kind": "vibes"})
    assert [f["kind"] for f in store.feedback(org="acme")] == ["accept"]
    assert store.feedback(org="other") == []


def test_bad_record_is_refused(store):
    with pytest.raises(ValueError):
        store.log_interaction({"org_id": "acme"})
    with pytest.raises(ValueError):
        store.log_interaction(_rec(not_a_column=1))


def test_a_committed_write_survives_kill_9_of_the_writer(db_url):
    """The writer process is SIGKILLed right after log_interaction returns; the row is there."""
    url = db_url
    code = (
        "import os, signal, sys\n"
        "from etude.store import open_store\n"
        f"s = open_store({url!r})\n"
        "iid = s.log_interaction({'org_id': 'acme', 'checkpoint': 'c', 'policy_version': 0})\n"
        "print(iid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == -9
    iid = out.stdout.strip()
    assert open_store(url).interaction("acme", iid)["checkpoint"] == "c"


def test_a_bad_url_is_one_clear_error():
    with pytest.raises(EtudeError):
        open_store("notadb://")


def test_group_commit_shares_commits_and_isolates_a_bad_record(store):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as ex:
        futs = list(ex.map(lambda i: store.submit([("interaction", _rec(user_id=f"u{i}"))]), range(40)))
    ids = [f.result(timeout=30)[0] for f in futs]
    assert len(set(ids)) == 40 and store.count_interactions("acme") == 40
    good = store.submit([("interaction", _rec())])
    bad = store.submit([("interaction", {"org_id": "acme"})])
    assert store.interaction("acme", good.result(timeout=30)[0])
    with pytest.raises(ValueError):
        bad.result(timeout=30)
    assert store.count_interactions("acme") == 41


def test_processes_opening_a_fresh_database_at_once_migrate_it_once(db_url):
    """Four processes open the same empty database together: all succeed, one schema results."""
    code = f"from etude.store import open_store\nprint(open_store({db_url!r}).count_interactions('acme'))\n"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-500:] for _, err in outs]
    assert [out.strip() for out, _ in outs] == ["0"] * 4
    s = open_store(db_url)
    assert current_revision(s.engine) == head_revision()
    s.close()
