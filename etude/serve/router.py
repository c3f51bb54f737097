"""The `auto` router: which checkpoint answers a request.

- An explicit model name is served as asked, if the org may use it (shared or its own) and it is
  not retired; otherwise NotFound (the same answer for "foreign" and "absent", so a name leaks
  nothing).
- `auto` with a session pinned already: the pinned checkpoint (a session never switches
  checkpoint mid-way; the only exception is a rollback, which re-pins, see registry.rollback).
- `auto` otherwise: an arm of the org's active experiment (else the shared one), chosen by the
  user's bucket, else the production checkpoint. The choice is pinned to the session.

Assignment: bucket = sha256(salt + ":" + user) read as a number in [0, 1); arms take
consecutive slices of [0, 1) in their listed order, sized by normalised weight. So the same
user always lands in the same arm for fixed weights, and when the *last* arm grows (10% canary
-> 50%) users only move into it, never out of it. Users without an id are bucketed by session.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from etude.errors import NotFound
from etude.serve.registry import Arm, Checkpoint, Experiment, active_experiment, get_checkpoint, production
from etude.store.sql import SQLStore


def bucket(salt: str, user: str) -> float:
    """A stable number in [0, 1) for (salt, user)."""
    h = hashlib.sha256(f"{salt}:{user}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def choose_arm(exp: Experiment, user: str) -> Arm:
    total = sum(a.weight for a in exp.arms)
    x, edge = bucket(exp.salt, user) * total, 0.0
    for arm in exp.arms:
        edge += arm.weight
        if x < edge and arm.weight > 0:
            return arm
    return next(a for a in reversed(exp.arms) if a.weight > 0)  # float rounding at the top edge


@dataclass(frozen=True)
class Route:
    checkpoint: Checkpoint
    experiment_id: str | None = None
    arm: str | None = None


class Router:
    def __init__(self, store: SQLStore):
        self.store = store

    def resolve(self, org: str, model: str, user: str, session: str | None) -> Route:
        if model != "auto":
            return Route(self._usable(org, model))
        if session:
            pin = self.store.session_pin(org, session)
            if pin is not None and self._still_usable(org, pin["checkpoint"]):
                return Route(self._usable(org, pin["checkpoint"]), pin["experiment_id"], pin["arm"])
        route = self._assign(org, user or session or "")
        if session:
            # A pin to a checkpoint retired without a rollback (set_state) is replaced, not served.
            pin = self.store.pin_session(org, session, user, route.checkpoint.name, route.experiment_id, route.arm,
                                         replace=pin is not None)
            if pin["checkpoint"] != route.checkpoint.name:  # another request of the session won the race
                return Route(self._usable(org, pin["checkpoint"]), pin["experiment_id"], pin["arm"])
        return route

    def _assign(self, org: str, user: str) -> Route:
        exp = active_experiment(self.store, org)
        if exp is not None:
            arm = choose_arm(exp, user)
            if self._still_usable(org, arm.checkpoint):  # else (a race with a retirement): production
                return Route(self._usable(org, arm.checkpoint), exp.id, arm.name)
        prod = production(self.store, org)
        if prod is None:
            raise NotFound("no production checkpoint is registered for model 'auto'")
        return Route(prod)

    def _still_usable(self, org: str, name: str) -> bool:
        try:
            self._usable(org, name)
        except NotFound:
            return False
        return True

    def _usable(self, org: str, name: str) -> Checkpoint:
        try:
            cp = get_checkpoint(self.store, name)
        except NotFound:
            cp = None
        if cp is None or not cp.visible_to(org) or cp.state == "retired":
            raise NotFound(f"model {name!r} does not exist or is not available to you")
        return cp
