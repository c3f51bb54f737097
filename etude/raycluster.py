"""Joining Ray, shared by everything that runs episodes on it (evals, training rollouts, the
loop's simulated users): `connect` starts a local Ray or joins a cluster, with an unreachable
address found by a TCP connect and reported in one line; `ray_get` raises a remote exception as
itself. `ray` is imported on first use, so importing this module costs nothing."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from etude.errors import EtudeError

T = TypeVar("T")


def ray_module() -> Any:
    """The ray module, imported on first use (importing etude must not pay for it)."""
    try:
        import ray
    except ImportError as e:  # ray is a pinned dependency; a broken install is one line
        raise EtudeError(f"running on Ray needs Ray ({e}): `pip install -e .` installs the pinned one") from None
    return ray


def connect(address: str | None, num_cpus: int | None = None) -> bool:
    """Join Ray: the cluster at `address`, else a new local Ray (of `num_cpus` CPUs; None: all).
    Returns True when this call initialised Ray (the caller then shuts it down), False when this
    process had already joined."""
    ray = ray_module()
    from ray.exceptions import RayError

    if address and address != "auto" and not address.startswith("ray://"):
        _check_reachable(address)
    if ray.is_initialized():
        return False
    try:
        # NOTE: "local", not None: ray.init() joins the cluster last started on this machine if its
        # address file is there, and retries for many minutes when that cluster has since died.
        ray.init(address=address or "local", num_cpus=None if address else num_cpus, ignore_reinit_error=True,
                 include_dashboard=False, log_to_driver=False)
    except (ConnectionError, RayError, RuntimeError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise EtudeError(f"cannot start or join {where}: {first}") from None
    return True


def _check_reachable(address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise EtudeError(f"--ray-address wants HOST:PORT (the GCS port of `ray start --head`), not {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise EtudeError(
            f"no Ray cluster answers at {address} ({e.strerror or e}); start one with "
            "`ray start --head --port=PORT`, or leave out --ray-address to run on a local Ray"
        ) from None


def ray_get(ref: Any) -> Any:
    """ray.get, raising a remote exception as itself rather than Ray's wrapper of it."""
    ray = ray_module()
    from ray.exceptions import RayTaskError

    try:
        return ray.get(ref)
    except RayTaskError as e:
        cause = getattr(e, "cause", None)
        raise (cause if isinstance(cause, BaseException) else e) from None


def failure(e: BaseException) -> str:
    """`Type: first line of the message`: how a dead worker or a remote error is recorded."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


def run_bounded(items: Sequence[T], submit: Callable[[T], Any], finish: Callable[[T, Any], None], limit: int) -> None:
    """`submit(item)` (an ObjectRef) for each item in order, at most `limit` in flight, and
    `finish(item, ref)` as each completes. On Ctrl-C or an error the queued items never start, and
    those in flight are still finished (their caller records them: a resumed run does not pay for
    them twice)."""
    ray = ray_module()
    queue = list(reversed(items))  # popped from the end: in the items' order
    inflight: dict[Any, T] = {}
    try:
        while queue or inflight:
            while queue and len(inflight) < limit:
                item = queue.pop()
                inflight[submit(item)] = item
            done, _ = ray.wait(list(inflight), num_returns=1)
            for ref in done:
                finish(inflight.pop(ref), ref)
    finally:
        for ref, item in list(inflight.items()):
            finish(item, ref)
