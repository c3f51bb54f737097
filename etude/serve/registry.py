"""The checkpoint registry and experiments: what the `auto` router may route to, and how.

A checkpoint is a name clients can ask for, a path the server loads (`tiny`, `smollm2`, a model
or adapter directory), a policy version, an owner (an organisation, or None for shared) and a
state: candidate -> canary -> production -> retired. Per scope (one org, or shared) there is at
most one production checkpoint; promoting a new one retires the old, and `rollback` retires the
current one and restores the production checkpoint it replaced, in one transaction (the router
reads the registry on every request, so a rollback takes effect on the next request).

An experiment (per scope, at most one active) splits `auto` traffic over arms by weight; see
`router.py` for how users are assigned. What the loop calls: `register_checkpoint`,
`set_experiment`, `promote`, `rollback`, `stop_experiment`, `record_readout` (the A/B readout it
decided on, which `etude serve`'s /dashboard shows), and `SQLStore.interactions(arm=...)`.

A checkpoint's weights never change under its name. For a LoRA adapter directory (small) the
registry records the sha256 of its files at registration (`meta["sha256"]`), and the server's
pool checks it before every load (`check_files`): an adapter directory rewritten in place after
registration is refused with one line instead of being served under the old name (vLLM once
served users a stale adapter under a reused name, vllm RFC #48312). `register_adapter` registers
an adapter the way `etude specialise --register` does: a snapshot copy named by its digest, at
the next version of its organisation.

Not guaranteed: that a checkpoint's path still exists on disk (the server reports it on load);
that a full model directory is unchanged (only adapters are hashed: a model is gigabytes); a
change between the check and the load (the check is not a lock).
An organisation may route only to shared checkpoints and its own; this is checked here, at
`set_experiment`, and again by the router on every request. Retiring a checkpoint (by any
route: promotion of another, rollback, set_state) stops the experiments that route to it.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from etude.errors import EtudeError, NotFound
from etude.paths import dir_sha256
from etude.store import schema as t
from etude.store.sql import ORG_RE, SQLStore

STATES = ("candidate", "canary", "production", "retired")
NAME_RE = ORG_RE  # checkpoint and experiment names: same charset as org names


@dataclass(frozen=True)
class Checkpoint:
    name: str
    path: str
    version: int
    state: str
    org_id: str | None = None  # None: shared by every organisation
    parent: str | None = None
    created_at: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def visible_to(self, org: str) -> bool:
        return self.org_id is None or self.org_id == org


@dataclass(frozen=True)
class Arm:
    name: str
    checkpoint: str
    weight: float


@dataclass(frozen=True)
class Experiment:
    id: str
    org_id: str | None
    salt: str
    arms: tuple[Arm, ...]
    status: str


def _ckpt(r: Any) -> Checkpoint:
    return Checkpoint(name=r.name, path=r.path, version=r.version, state=r.state, org_id=r.org_id,
                      parent=r.parent, created_at=r.created_at, meta=dict(r.meta or {}))


def _exp(r: Any) -> Experiment:
    arms = tuple(Arm(a["name"], a["checkpoint"], float(a["weight"])) for a in r.arms)
    return Experiment(id=r.id, org_id=r.org_id, salt=r.salt, arms=arms, status=r.status)


def _scope(col: Any, org: str | None) -> Any:
    return col.is_(None) if org is None else col == org


def _own_or_shared(store: SQLStore, table: sa.Table, where: Any, org: str | None) -> Any:
    """The first row of `table` matching `where` in the org's own scope, else in the shared one."""
    with store.read() as conn:
        for scope in ([org] if org is not None else []) + [None]:
            r = conn.execute(sa.select(table).where(where, _scope(table.c.org_id, scope))).first()
            if r is not None:
                return r
    return None


# -- checkpoints ----------------------------------------------------------------------------
def register_checkpoint(store: SQLStore, name: str, path: str, *, version: int = 0, org: str | None = None,
                        parent: str | None = None, state: str = "candidate",
                        meta: dict[str, Any] | None = None) -> Checkpoint:
    """Add a checkpoint (a new name). Registering as "production" goes through `promote`.
    An adapter directory's digest goes into `meta["sha256"]` (see `check_files`)."""
    if not NAME_RE.match(name or "") or name == "auto":
        raise EtudeError(f"bad checkpoint name {name!r}: letters, digits, '.', '_', '-'; not 'auto'")
    if state not in STATES:
        raise EtudeError(f"unknown state {state!r}: use one of {', '.join(STATES)}")
    meta = dict(meta or {})
    digest = adapter_digest(path)
    if digest is not None:
        if meta.get("sha256", digest) != digest:
            raise EtudeError(f"adapter {path}: its files hash to {digest[:12]}, not the sha256 {meta['sha256'][:12]} given")
        meta["sha256"] = digest
    now = time.time()
    with store.write() as conn:
        if conn.execute(sa.select(t.checkpoints.c.name).where(t.checkpoints.c.name == name)).first():
            raise EtudeError(f"checkpoint {name!r} is already registered")
        if org is not None:
            store.ensure_org(org, conn)
        conn.execute(t.checkpoints.insert().values(
            name=name, org_id=org, path=str(path), version=int(version), state="candidate", parent=parent,
            created_at=now, updated_at=now, meta=meta))
        _event(conn, name, None, "candidate", "registered")
        if state == "production":
            _promote(conn, name)
        elif state != "candidate":
            _set_state(conn, name, state, "registered")
    return get_checkpoint(store, name)


def adapter_digest(path: str | Path) -> str | None:
    """sha256 over the relative names and bytes of a LoRA adapter directory's files (one with
    peft's adapter_config.json), or None for anything else."""
    return dir_sha256(path) if (Path(path) / "adapter_config.json").is_file() else None


def check_files(cp: Checkpoint) -> None:
    """Refuse (EtudeError, one line) an adapter whose files differ from those registered."""
    want = cp.meta.get("sha256")
    if not want:
        return
    got = adapter_digest(cp.path)
    if got != want:
        now = "it is no longer an adapter directory" if got is None else f"its files now hash to {got[:12]}"
        raise EtudeError(f"checkpoint {cp.name!r}: the adapter at {cp.path} changed since it was registered (sha256 "
                         f"{want[:12]}; {now}); a checkpoint's weights never change: register the new ones under a new name")


def next_version(store: SQLStore, org: str | None) -> int:
    """1 + the highest version among the scope's own checkpoints (retired ones included)."""
    c = t.checkpoints.c
    with store.read() as conn:
        top = conn.execute(sa.select(sa.func.max(c.version)).where(_scope(c.org_id, org))).scalar()
    return int(top or 0) + 1


def register_adapter(store: SQLStore, org: str, adapter: str | Path, snapshots: str | Path, *,
                     prefix: str | None = None, meta: dict[str, Any] | None = None) -> Checkpoint:
    """Register an org's LoRA adapter as an immutable, versioned checkpoint: its files are copied
    to `snapshots/<digest[:16]>` (a later run that rewrites `adapter` in place cannot touch what
    is served), the name is `<prefix or org-spec>-<digest[:10]>` and the version the org's next.
    The same files registered again return the existing checkpoint (same name, same version)."""
    digest = adapter_digest(adapter)
    if digest is None:
        raise EtudeError(f"{adapter} is not a LoRA adapter directory (no adapter_config.json)")
    name = f"{prefix or f'{org}-spec'}-{digest[:10]}"
    try:
        return get_checkpoint(store, name)
    except NotFound:
        pass
    snap = Path(snapshots) / digest[:16]
    if adapter_digest(snap) != digest:  # absent, or a half-finished copy of an earlier try
        tmp = snap.with_name(snap.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(adapter, tmp)
        shutil.rmtree(snap, ignore_errors=True)
        tmp.rename(snap)
    return register_checkpoint(store, name, str(snap), version=next_version(store, org), org=org,
                               meta={**(meta or {}), "sha256": digest, "source": str(adapter)})


def get_checkpoint(store: SQLStore, name: str) -> Checkpoint:
    with store.read() as conn:
        return _ckpt(_get(conn, name))


def list_checkpoints(store: SQLStore, org: str | None = None, *, include_retired: bool = True,
                     shared: bool = True) -> list[Checkpoint]:
    """Checkpoints of `org` (plus shared ones if `shared`); org None lists only shared ones."""
    c = t.checkpoints.c
    scope = _scope(c.org_id, org)
    if org is not None and shared:
        scope = sa.or_(scope, c.org_id.is_(None))
    q = sa.select(t.checkpoints).where(scope).order_by(c.created_at)
    if not include_retired:
        q = q.where(c.state != "retired")
    with store.read() as conn:
        return [_ckpt(r) for r in conn.execute(q)]


def production(store: SQLStore, org: str | None) -> Checkpoint | None:
    """The org's own production checkpoint if it has one, else the shared one."""
    r = _own_or_shared(store, t.checkpoints, t.checkpoints.c.state == "production", org)
    return None if r is None else _ckpt(r)


def set_state(store: SQLStore, name: str, state: str, reason: str = "") -> Checkpoint:
    """Move a checkpoint to `state`. "production" means `promote`."""
    if state not in STATES:
        raise EtudeError(f"unknown state {state!r}: use one of {', '.join(STATES)}")
    if state == "production":
        return promote(store, name, reason)
    with store.write() as conn:
        _set_state(conn, name, state, reason)
    return get_checkpoint(store, name)


def promote(store: SQLStore, name: str, reason: str = "") -> Checkpoint:
    """Make `name` the production checkpoint of its scope; the previous one is retired."""
    with store.write() as conn:
        _promote(conn, name, reason)
    return get_checkpoint(store, name)


def rollback(store: SQLStore, name: str | None = None, *, org: str | None = None, reason: str = "rollback") -> Checkpoint | None:
    """Retire `name` (default: the production checkpoint of `org`'s scope) at once.

    If it was production, the checkpoint it replaced becomes production again. Experiments that
    route to it are stopped, and sessions pinned to it move to the production checkpoint (the
    one case where a session changes checkpoint mid-way: a rollback is an emergency). Returns
    the production checkpoint in force afterwards.
    """
    with store.write() as conn:
        if name is None:
            r = conn.execute(sa.select(t.checkpoints.c.name).where(
                t.checkpoints.c.state == "production", _scope(t.checkpoints.c.org_id, org))).first()
            if r is None:
                raise NotFound("no production checkpoint to roll back")
            name = r.name
        row = _get(conn, name)
        if row.state == "retired":
            raise EtudeError(f"checkpoint {name!r} is already retired")
        restored = _previous_production(conn, name) if row.state == "production" else None
        _set_state(conn, name, "retired", reason)
        if restored is not None:
            _set_state(conn, restored, "production", f"restored by rollback of {name}")
        _stop_experiments_using(conn, name)
    prod = production(store, row.org_id)
    if prod is not None:
        store.repin_sessions(name, prod.name)
    return prod


def _get(conn: sa.Connection, name: str) -> Any:
    r = conn.execute(sa.select(t.checkpoints).where(t.checkpoints.c.name == name)).first()
    if r is None:
        raise NotFound(f"no checkpoint {name!r}")
    return r


def _event(conn: sa.Connection, name: str, old: str | None, new: str, reason: str) -> None:
    conn.execute(t.checkpoint_events.insert().values(checkpoint=name, from_state=old, to_state=new,
                                                     at=time.time(), reason=reason))


def _set_state(conn: sa.Connection, name: str, state: str, reason: str) -> None:
    old = _get(conn, name).state
    conn.execute(t.checkpoints.update().where(t.checkpoints.c.name == name)
                 .values(state=state, updated_at=time.time()))
    _event(conn, name, old, state, reason)
    if state == "retired":  # however it got retired (promotion of another, rollback, by hand)
        _stop_experiments_using(conn, name)


def _promote(conn: sa.Connection, name: str, reason: str = "") -> None:
    row = _get(conn, name)
    c = t.checkpoints.c
    for old in conn.execute(sa.select(c.name).where(c.state == "production", _scope(c.org_id, row.org_id),
                                                    c.name != name)).all():
        _set_state(conn, old.name, "retired", f"replaced by {name}")
    if row.state != "production":
        _set_state(conn, name, "production", reason or "promoted")


def _previous_production(conn: sa.Connection, name: str) -> str | None:
    # The checkpoint retired with reason "replaced by <name>" most recently is the one to restore.
    e = t.checkpoint_events.c
    r = conn.execute(sa.select(e.checkpoint).where(e.reason == f"replaced by {name}", e.to_state == "retired")
                     .order_by(e.id.desc())).first()
    return None if r is None else r.checkpoint


# -- experiments ----------------------------------------------------------------------------
def set_experiment(store: SQLStore, exp_id: str, arms: list[tuple[str, str, float]], *, org: str | None = None,
                   salt: str | None = None) -> Experiment:
    """Create or update the active experiment of a scope: arms are (name, checkpoint, weight).
    Arm checkpoints still in "candidate" become "canary".

    Updating keeps the salt (so users keep their buckets) unless one is given; order matters
    for stickiness when weights change (see router.py): keep control first, canary last.
    Any other active experiment of the same scope is stopped.
    """
    if not NAME_RE.match(exp_id or ""):
        raise EtudeError(f"bad experiment name {exp_id!r}")
    _check_arms(store, arms, org)
    now = time.time()
    arm_rows = [{"name": a, "checkpoint": c, "weight": float(w)} for a, c, w in arms]
    x = t.experiments.c
    with store.write() as conn:
        existing = conn.execute(sa.select(t.experiments).where(x.id == exp_id)).first()
        if existing is not None and existing.org_id != org:
            raise EtudeError(f"experiment {exp_id!r} belongs to another scope")
        conn.execute(t.experiments.update().where(_scope(x.org_id, org), x.status == "active", x.id != exp_id)
                     .values(status="stopped", updated_at=now))
        if existing is None:
            conn.execute(t.experiments.insert().values(id=exp_id, org_id=org, salt=salt or secrets.token_hex(8),
                                                       arms=arm_rows, status="active", created_at=now, updated_at=now))
        else:
            conn.execute(t.experiments.update().where(x.id == exp_id).values(
                arms=arm_rows, status="active", updated_at=now, salt=salt or existing.salt))
        for _, ckpt, _ in arms:  # a candidate that takes traffic is a canary now
            if _get(conn, ckpt).state == "candidate":
                _set_state(conn, ckpt, "canary", f"arm of experiment {exp_id}")
    return get_experiment(store, exp_id)


def _check_arms(store: SQLStore, arms: list[tuple[str, str, float]], org: str | None) -> None:
    if not arms:
        raise EtudeError("an experiment needs at least one arm")
    if len({a for a, _, _ in arms}) != len(arms):
        raise EtudeError("arm names must be distinct")
    if any(w < 0 for _, _, w in arms) or sum(w for _, _, w in arms) <= 0:
        raise EtudeError("arm weights must be >= 0 and sum to more than 0")
    for _, ckpt, _ in arms:
        cp = get_checkpoint(store, ckpt)
        if cp.state == "retired":
            raise EtudeError(f"checkpoint {ckpt!r} is retired")
        if cp.org_id is not None and cp.org_id != org:
            raise EtudeError(f"checkpoint {ckpt!r} belongs to another organisation")


def get_experiment(store: SQLStore, exp_id: str) -> Experiment:
    with store.read() as conn:
        r = conn.execute(sa.select(t.experiments).where(t.experiments.c.id == exp_id)).first()
    if r is None:
        raise NotFound(f"no experiment {exp_id!r}")
    return _exp(r)


def active_experiment(store: SQLStore, org: str | None) -> Experiment | None:
    """The org's own active experiment if it has one, else the shared one."""
    r = _own_or_shared(store, t.experiments, t.experiments.c.status == "active", org)
    return None if r is None else _exp(r)


def stop_experiment(store: SQLStore, exp_id: str) -> Experiment:
    with store.write() as conn:
        n = conn.execute(t.experiments.update().where(t.experiments.c.id == exp_id)
                         .values(status="stopped", updated_at=time.time())).rowcount
    if n == 0:
        raise NotFound(f"no experiment {exp_id!r}")
    return get_experiment(store, exp_id)


def list_experiments(store: SQLStore, org: str | None = None) -> list[Experiment]:
    x = t.experiments.c
    with store.read() as conn:
        return [_exp(r) for r in conn.execute(sa.select(t.experiments).where(_scope(x.org_id, org)).order_by(x.created_at))]


def _stop_experiments_using(conn: sa.Connection, name: str) -> None:
    x = t.experiments.c
    for r in conn.execute(sa.select(t.experiments).where(x.status == "active")).all():
        if any(a["checkpoint"] == name for a in r.arms):
            conn.execute(t.experiments.update().where(x.id == r.id).values(status="stopped", updated_at=time.time()))


# -- plans ----------------------------------------------------------------------------------
def _plan_digest(plan: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(_finite(plan), sort_keys=True).encode()).hexdigest()


def register_plan(store: SQLStore, exp_id: str, plan: dict[str, Any]) -> dict[str, Any]:
    """Register `plan` for experiment `exp_id` before its traffic; returns what is registered, as
    `registered_plan` reads it ({"registered_at", "sha256", "plan"}).
    The same plan again (a resumed cycle) is a no-op. Refused (EtudeError) when a different plan
    is registered already, or when the experiment has traffic and no plan: a readout decides on
    the plan it announced before its first user, never on one chosen after seeing data."""
    exp = get_experiment(store, exp_id)
    digest = _plan_digest(plan)
    p = t.experiment_plans.c
    with store.write() as conn:
        row = conn.execute(sa.select(t.experiment_plans).where(p.experiment_id == exp_id)).first()
        if row is not None:
            if row.sha256 != digest:
                old, new = dict(row.plan), _finite(plan)
                changed = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
                           if old.get(k) != new.get(k)]
                raise EtudeError(f"experiment {exp_id} registered its plan before traffic; changing it is refused "
                                 f"({'; '.join(changed)[:400]})")
            return {"registered_at": row.registered_at, "sha256": row.sha256, "plan": dict(row.plan)}
        seen = conn.execute(sa.select(sa.func.count()).select_from(t.interactions)
                            .where(t.interactions.c.experiment_id == exp_id)).scalar_one()
        if seen:
            raise EtudeError(f"experiment {exp_id} already has {seen} interaction(s): a plan registered after traffic "
                             "started is refused")
        now = time.time()
        conn.execute(t.experiment_plans.insert().values(experiment_id=exp_id, org_id=exp.org_id,
                                                        registered_at=now, sha256=digest, plan=_finite(plan)))
    return {"registered_at": now, "sha256": digest, "plan": _finite(plan)}


def registered_plan(store: SQLStore, exp_id: str) -> dict[str, Any] | None:
    """{"registered_at", "sha256", "plan"} of experiment `exp_id`, or None."""
    p = t.experiment_plans.c
    with store.read() as conn:
        row = conn.execute(sa.select(t.experiment_plans).where(p.experiment_id == exp_id)).first()
    return None if row is None else {"registered_at": row.registered_at, "sha256": row.sha256, "plan": dict(row.plan)}


# -- readouts -------------------------------------------------------------------------------
def record_readout(store: SQLStore, exp_id: str, readout: dict[str, Any]) -> None:
    """Keep one readout of an experiment (the loop records each it decides on). Non-finite
    numbers are stored as null (JSON has none)."""
    exp = get_experiment(store, exp_id)
    with store.write() as conn:
        conn.execute(t.experiment_readouts.insert().values(experiment_id=exp_id, org_id=exp.org_id, at=time.time(),
                                                           readout=_finite(readout)))


def latest_readout(store: SQLStore, exp_id: str) -> dict[str, Any] | None:
    """{"at": epoch seconds, "readout": {...}} of the newest recorded readout, or None."""
    r = t.experiment_readouts.c
    with store.read() as conn:
        row = conn.execute(sa.select(r.at, r.readout).where(r.experiment_id == exp_id).order_by(r.id.desc())).first()
    return None if row is None else {"at": row.at, "readout": dict(row.readout)}


def _finite(x: Any) -> Any:
    if type(x).__module__ == "numpy" and hasattr(x, "item"):  # numpy scalars (analyze's figures)
        x = x.item()
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
