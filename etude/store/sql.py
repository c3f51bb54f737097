"""`SQLStore`: organisations, API keys, interactions, messages, feedback, session pins.

Every read takes an organisation and filters on it; there is no read that spans organisations
(the registry in `etude.serve.registry` is the one shared table, and it scopes by org too).
Writes return only after their transaction committed (see `engine.py` for what "committed"
means on SQLite), which is what the server relies on to acknowledge a response.

API keys look like `etk_<id>_<secret>`; only sha256(key) is stored, with the public `<id>` as
the row key so authentication is one primary-key lookup and a constant-time compare. sha256
(not a slow password hash) is enough because keys are 192-bit random, not human passwords.
"""

from __future__ import annotations

import hashlib
import hmac
import queue
import re
import secrets
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from etude.errors import EtudeError, NotFound
from etude.store import schema as t
from etude.store.engine import make_engine, migrate, resolve_url

ORG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
KEY_RE = re.compile(r"^etk_([0-9a-f]{10})_([A-Za-z0-9_-]{20,})$")

INTERACTION_FIELDS = (
    "org_id user_id session_id model checkpoint policy_version experiment_id arm created_at params tools "
    "response finish_reason prompt_token_ids completion_token_ids logprobs prompt_tokens completion_tokens "
    "latency_s ttft_s queue_s"
).split()
FEEDBACK_KINDS = ("edit_persistence", "followup", "latency", "accept", "reject", "retry")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _row(r: sa.Row[Any]) -> dict[str, Any]:
    return dict(r._mapping)


class SQLStore:
    """The SQL implementation of `protocols.Store` (see module docstring)."""

    def __init__(self, url: str, engine: Engine):
        self.url = url
        self.engine = engine
        self.is_sqlite = engine.url.get_backend_name() == "sqlite"
        # SQLite has one writer at a time anyway; queueing writers here (rather than in
        # SQLite's busy handler, which sleeps in coarse steps) keeps commit latency flat.
        self._write_lock = threading.Lock()
        self._committer: GroupCommitter | None = None
        self._committer_lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------------------
    @contextmanager
    def write(self) -> Iterator[sa.Connection]:
        """One durable write transaction (committed when the block exits without error)."""
        with self._write_lock, self.engine.connect().execution_options(etude_write=True) as conn:
            with conn.begin():
                yield conn

    @contextmanager
    def read(self) -> Iterator[sa.Connection]:
        with self.engine.connect() as conn:
            yield conn

    def close(self) -> None:
        if self._committer is not None:
            self._committer.close()
        self.engine.dispose()

    # -- organisations and keys -----------------------------------------------------------
    def ensure_org(self, org: str, conn: sa.Connection | None = None) -> str:
        if not ORG_RE.match(org or ""):
            raise EtudeError(f"bad organisation name {org!r}: use letters, digits, '.', '_' or '-' (1-128 chars)")
        if conn is None:
            with self.write() as c:
                return self.ensure_org(org, c)
        if conn.execute(sa.select(t.orgs.c.id).where(t.orgs.c.id == org)).first() is None:
            conn.execute(t.orgs.insert().values(id=org, created_at=time.time()))
        return org

    def create_key(self, org: str, name: str = "", *, admin: bool = False) -> str:
        """A new API key for `org` (creating the org). The key is returned once, never stored.
        An `admin` key acts as `org` everywhere except /dashboard, where it sees every org."""
        kid, secret = secrets.token_hex(5), secrets.token_urlsafe(24)
        key = f"etk_{kid}_{secret}"
        with self.write() as conn:
            self.ensure_org(org, conn)
            conn.execute(t.api_keys.insert().values(
                id=kid, org_id=org, key_hash=hash_key(key), name=name, created_at=time.time(), admin=bool(admin)))
        return key

    def authenticate(self, key: str | None) -> str | None:
        """The organisation a key belongs to, or None (malformed, unknown or revoked)."""
        ident = self.identify(key)
        return None if ident is None else ident["org_id"]

    def identify(self, key: str | None) -> dict[str, Any] | None:
        """{"id", "org_id", "admin"} of a valid key, or None (malformed, unknown or revoked)."""
        m = KEY_RE.match(key or "")
        if not m:
            return None
        row = self.key_record(m.group(1))
        if row is None or not hmac.compare_digest(row.pop("key_hash"), hash_key(key or "")):
            return None
        return row

    def key_record(self, key_id: str) -> dict[str, Any] | None:
        """{"id", "org_id", "admin", "key_hash"} of a key that is not revoked, by its public id."""
        k = t.api_keys.c
        with self.read() as conn:
            row = conn.execute(sa.select(k.id, k.org_id, k.admin, k.key_hash, k.revoked_at)
                               .where(k.id == key_id)).first()
        if row is None or row.revoked_at is not None:
            return None
        return {"id": row.id, "org_id": row.org_id, "admin": bool(row.admin), "key_hash": row.key_hash}

    def list_orgs(self) -> list[str]:
        """Every organisation's name (for admin views; no data of theirs)."""
        with self.read() as conn:
            return [r.id for r in conn.execute(sa.select(t.orgs.c.id).order_by(t.orgs.c.id))]

    def list_keys(self, org: str) -> list[dict[str, Any]]:
        q = sa.select(t.api_keys.c.id, t.api_keys.c.name, t.api_keys.c.created_at, t.api_keys.c.revoked_at,
                      t.api_keys.c.admin)
        with self.read() as conn:
            return [_row(r) for r in conn.execute(q.where(t.api_keys.c.org_id == org).order_by(t.api_keys.c.created_at))]

    def revoke_key(self, org: str, key_id: str) -> None:
        with self.write() as conn:
            n = conn.execute(t.api_keys.update()
                             .where(t.api_keys.c.id == key_id, t.api_keys.c.org_id == org)
                             .values(revoked_at=time.time())).rowcount
        if n == 0:
            raise NotFound(f"no key {key_id!r} in organisation {org!r}")

    # -- interactions ---------------------------------------------------------------------
    def log_interaction(self, record: dict[str, Any]) -> str:
        """Insert one interaction and its request messages; durable when this returns.

        `record` has the `interactions` columns (see schema.py) plus `messages`: a list of
        {"role", "content", "tool_calls", "tool_call_id"}. `id` is generated if absent.
        """
        with self.write() as conn:
            return self._insert_interaction(conn, record)

    def log_many(self, items: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
        """Write ("interaction" | "feedback", record) items in one transaction (one fsync)."""
        with self.write() as conn:
            return [self._insert(conn, kind, rec) for kind, rec in items]

    def submit(self, items: Sequence[tuple[str, dict[str, Any]]]) -> Future[list[str]]:
        """`log_many` through the group committer: items of concurrent callers share one commit.
        The future resolves (to the ids) only after that commit, or fails with the error."""
        if self._committer is None:
            with self._committer_lock:
                if self._committer is None:
                    self._committer = GroupCommitter(self)
        return self._committer.submit(items)

    def _insert(self, conn: sa.Connection, kind: str, rec: dict[str, Any]) -> str:
        if kind == "interaction":
            return self._insert_interaction(conn, rec)
        if kind == "feedback":
            return self._insert_feedback(conn, rec)
        raise ValueError(f"unknown record kind {kind!r}")

    def _insert_interaction(self, conn: sa.Connection, record: dict[str, Any]) -> str:
        rec = dict(record)
        iid = rec.pop("id", None) or new_id("chatcmpl")
        msgs = rec.pop("messages", [])
        missing = [k for k in ("org_id", "checkpoint", "policy_version") if rec.get(k) is None]
        if missing:
            raise ValueError(f"interaction record lacks {missing}")
        row = _interaction_defaults(rec)
        conn.execute(t.interactions.insert().values(id=iid, **row))
        if msgs:
            conn.execute(t.messages.insert(), [_message_row(iid, row["org_id"], i, m) for i, m in enumerate(msgs)])
        return iid

    def interaction(self, org: str, interaction_id: str, *, with_messages: bool = True) -> dict[str, Any]:
        """One interaction of `org`; NotFound if it does not exist *or belongs to another org*."""
        with self.read() as conn:
            r = conn.execute(sa.select(t.interactions).where(
                t.interactions.c.id == interaction_id, t.interactions.c.org_id == org)).first()
            if r is None:
                raise NotFound(f"no interaction {interaction_id!r}")
            out = _row(r)
            if with_messages:
                out["messages"] = self._messages(conn, [interaction_id])[interaction_id]
        return out

    def interactions(
        self,
        *,
        org: str,
        since: float | None = None,
        until: float | None = None,
        checkpoint: str | None = None,
        experiment_id: str | None = None,
        arm: str | None = None,
        session_id: str | None = None,
        user_id: str | None = None,
        limit: int | None = None,
        with_messages: bool = False,
    ) -> list[dict[str, Any]]:
        """Interactions of one organisation, oldest first, filtered by window and arm."""
        c = t.interactions.c
        q = sa.select(t.interactions).where(c.org_id == org)
        for col, val in ((c.checkpoint, checkpoint), (c.experiment_id, experiment_id), (c.arm, arm),
                         (c.session_id, session_id), (c.user_id, user_id)):
            if val is not None:
                q = q.where(col == val)
        if since is not None:
            q = q.where(c.created_at >= since)
        if until is not None:
            q = q.where(c.created_at < until)
        q = q.order_by(c.created_at, c.id)
        if limit is not None:
            q = q.limit(limit)
        with self.read() as conn:
            rows = [_row(r) for r in conn.execute(q)]
            if with_messages and rows:
                by_id = self._messages(conn, [r["id"] for r in rows])
                for r in rows:
                    r["messages"] = by_id[r["id"]]
        return rows

    @staticmethod
    def _newest_in_session(org: str, session_id: str, *cols: Any) -> sa.Select[Any]:
        c = t.interactions.c
        return (sa.select(*cols).where(c.org_id == org, c.session_id == session_id)
                .order_by(c.created_at.desc(), c.id.desc()).limit(1))

    def last_interaction(self, org: str, session_id: str) -> dict[str, Any] | None:
        """The newest interaction of a session, with its messages (for follow-up detection)."""
        with self.read() as conn:
            r = conn.execute(self._newest_in_session(org, session_id, t.interactions)).first()
            if r is None:
                return None
            out = _row(r)
            out["messages"] = self._messages(conn, [out["id"]])[out["id"]]
        return out

    def last_in_session(self, org: str, session_id: str) -> tuple[str, str | None] | None:
        """The id of a session's newest interaction and the content of its last user message (None
        when it has none), or None for a session with no interaction: what the server's follow-up
        detection and feedback-by-session read on every request, without decoding the row's token
        ids and log-probs or its other messages (last_interaction returns all of them)."""
        m = t.messages.c
        with self.read() as conn:
            iid = conn.execute(self._newest_in_session(org, session_id, t.interactions.c.id)).scalar_one_or_none()
            if iid is None:
                return None
            content = conn.execute(sa.select(m.content).where(m.interaction_id == iid, m.role == "user")
                                   .order_by(m.position.desc()).limit(1)).scalar_one_or_none()
        return iid, content

    def count_interactions(self, org: str) -> int:
        with self.read() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(t.interactions)
                                    .where(t.interactions.c.org_id == org)).scalar_one())

    def _messages(self, conn: sa.Connection, ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
        m = t.messages.c
        for start in range(0, len(ids), 500):  # stay under SQLite's bound-parameter limit
            chunk = list(ids[start:start + 500])
            for r in conn.execute(sa.select(t.messages).where(m.interaction_id.in_(chunk)).order_by(m.interaction_id, m.position)):
                out[r.interaction_id].append(_row(r))
        return out

    def label_message(self, org: str, interaction_id: str, position: int, label: str, source: str) -> None:
        """Store a follow-up label beside a request message (e.g. "dissatisfied", source "rules")."""
        m = t.messages.c
        with self.write() as conn:
            n = conn.execute(t.messages.update()
                             .where(m.org_id == org, m.interaction_id == interaction_id, m.position == position)
                             .values(label=label, label_source=source)).rowcount
        if n == 0:
            raise NotFound(f"no message {position} in interaction {interaction_id!r}")

    # -- feedback -------------------------------------------------------------------------
    def log_feedback(self, record: dict[str, Any]) -> str:
        """Attach one feedback event to an interaction of the same org; durable on return.

        record: org_id, interaction_id, kind (one of FEEDBACK_KINDS), value (float|None),
        data (dict), source ("client"|"server"). NotFound if the interaction is not the org's.
        """
        with self.write() as conn:
            return self._insert_feedback(conn, record)

    def _insert_feedback(self, conn: sa.Connection, record: dict[str, Any]) -> str:
        kind = record.get("kind")
        if kind not in FEEDBACK_KINDS:
            raise EtudeError(f"unknown feedback kind {kind!r}: use one of {', '.join(FEEDBACK_KINDS)}")
        org, iid = record["org_id"], record["interaction_id"]
        fid = record.get("id") or new_id("fb")
        value = record.get("value")
        owner = conn.execute(sa.select(t.interactions.c.org_id).where(t.interactions.c.id == iid)).scalar()
        if owner != org:  # unknown and foreign look the same from outside
            raise NotFound(f"no interaction {iid!r}")
        conn.execute(t.feedback.insert().values(
            id=fid, org_id=org, interaction_id=iid, kind=kind,
            value=None if value is None else float(value), data=dict(record.get("data") or {}),
            source=record.get("source", "client"), created_at=record.get("created_at") or time.time()))
        return fid

    def feedback(self, *, org: str, interaction_ids: Sequence[str] | None = None,
                 since: float | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        f = t.feedback.c
        q = sa.select(t.feedback).where(f.org_id == org)
        if since is not None:
            q = q.where(f.created_at >= since)
        if kind is not None:
            q = q.where(f.kind == kind)
        q = q.order_by(f.created_at)
        with self.read() as conn:
            if interaction_ids is None:
                return [_row(r) for r in conn.execute(q)]
            out: list[dict[str, Any]] = []
            ids = list(interaction_ids)
            for start in range(0, len(ids), 500):
                out += [_row(r) for r in conn.execute(q.where(f.interaction_id.in_(ids[start:start + 500])))]
            return sorted(out, key=lambda r: r["created_at"])

    # -- session pins (the router's stickiness) -------------------------------------------
    def session_pin(self, org: str, session_id: str) -> dict[str, Any] | None:
        s = t.sessions.c
        with self.read() as conn:
            r = conn.execute(sa.select(t.sessions).where(s.org_id == org, s.session_id == session_id)).first()
        return None if r is None else _row(r)

    def pin_session(self, org: str, session_id: str, user_id: str, checkpoint: str,
                    experiment_id: str | None, arm: str | None, *, replace: bool = False) -> dict[str, Any]:
        """Pin a session to a checkpoint unless it is pinned already (or `replace`); returns the pin in force."""
        s = t.sessions.c
        with self.write() as conn:
            r = conn.execute(sa.select(t.sessions).where(s.org_id == org, s.session_id == session_id)).first()
            if r is not None and not replace:
                return _row(r)
            if r is not None:
                conn.execute(t.sessions.delete().where(s.org_id == org, s.session_id == session_id))
            row = dict(org_id=org, session_id=session_id, user_id=user_id, checkpoint=checkpoint,
                       experiment_id=experiment_id, arm=arm, created_at=time.time())
            conn.execute(t.sessions.insert().values(**row))
        return row

    def repin_sessions(self, from_checkpoint: str, to_checkpoint: str) -> int:
        """Move every session pinned to `from_checkpoint` (a rollback); returns how many moved."""
        with self.write() as conn:
            return conn.execute(t.sessions.update().where(t.sessions.c.checkpoint == from_checkpoint)
                                .values(checkpoint=to_checkpoint, experiment_id=None, arm=None)).rowcount


class GroupCommitter:
    """Group commit: one thread writes everything queued since its last commit in one
    transaction, so N concurrent acknowledgements cost one fsync, not N. If the shared
    transaction fails, each caller's items are retried alone, so one bad record fails only its
    own caller."""

    def __init__(self, store: SQLStore, max_items: int = 256):
        self.store, self.max_items = store, max_items
        self._q: queue.Queue[tuple[Sequence[tuple[str, dict[str, Any]]], Future[list[str]]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="etude-group-commit", daemon=True)
        self._thread.start()

    def submit(self, items: Sequence[tuple[str, dict[str, Any]]]) -> Future[list[str]]:
        fut: Future[list[str]] = Future()
        self._q.put((list(items), fut))
        return fut

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            first = self._q.get()
            if first is None:
                return
            group = [first]
            while len(group) < self.max_items:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._q.put(None)
                    break
                group.append(nxt)
            self._commit(group)

    def _commit(self, group: list[tuple[Sequence[tuple[str, dict[str, Any]]], Future[list[str]]]]) -> None:
        try:
            ids = self.store.log_many([it for items, _ in group for it in items])
        except Exception:  # someone's record is bad: find out whose, one transaction each
            for items, fut in group:
                try:
                    fut.set_result(self.store.log_many(items))
                except Exception as e:
                    fut.set_exception(e)
            return
        k = 0
        for items, fut in group:
            fut.set_result(ids[k:k + len(items)])
            k += len(items)


def _interaction_defaults(rec: dict[str, Any]) -> dict[str, Any]:
    unknown = set(rec) - set(INTERACTION_FIELDS)
    if unknown:
        raise ValueError(f"unknown interaction fields {sorted(unknown)}")
    row: dict[str, Any] = dict(user_id="", session_id="", model=rec.get("checkpoint", ""), experiment_id=None,
                               arm=None, created_at=time.time(), params={}, tools=[], response={},
                               finish_reason="stop", prompt_token_ids=[], completion_token_ids=[], logprobs=[],
                               ttft_s=None, queue_s=None, latency_s=0.0)
    row.update(rec)
    row["prompt_token_ids"] = [int(x) for x in row["prompt_token_ids"]]
    row["completion_token_ids"] = [int(x) for x in row["completion_token_ids"]]
    row["logprobs"] = [float(x) for x in row["logprobs"]]
    row.setdefault("prompt_tokens", len(row["prompt_token_ids"]))
    row.setdefault("completion_tokens", len(row["completion_token_ids"]))
    return row


def _message_row(iid: str, org: str, pos: int, m: dict[str, Any]) -> dict[str, Any]:
    return dict(interaction_id=iid, org_id=org, position=pos, role=m["role"], content=m.get("content") or "",
                tool_calls=list(m.get("tool_calls") or []), tool_call_id=m.get("tool_call_id"),
                label=m.get("label"), label_source=m.get("label_source"))


def open_store(url: str | None = None, *, migrate_schema: bool = True) -> SQLStore:
    """Open (creating and migrating) the store at `url`, $ETUDE_DB, or ~/.etude/etude.db."""
    resolved = resolve_url(url)
    engine = make_engine(resolved)
    if migrate_schema:
        try:
            migrate(engine)
        except sa.exc.OperationalError as e:
            raise EtudeError(f"cannot open database {resolved}: {str(e.orig).splitlines()[0]}") from e
    return SQLStore(resolved, engine)
