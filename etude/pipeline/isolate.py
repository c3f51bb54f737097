"""Run a training stage in a process of its own, so the memory it used goes back to the system.

A pipeline (`etude demo`, `etude specialise`, bench/agent_learning.py) trains and then evaluates in
one long-lived process. What a training stage allocated (activations, optimizer state, gathered
trajectories) stays in that process after the stage: the allocator keeps freed pages for reuse,
and the demo measured 9.6 GiB still held after its SFT stage while the next stage's vLLM engine
added 4.4 GiB beside it. `in_child(fn, *args)` runs `fn` in a fresh spawned interpreter and
returns its (picklable) result; when the child exits, its memory is gone.

Errors: an EtudeError in the child is raised again here with its message (one line for the
operator); Ctrl-C in the child is KeyboardInterrupt here; any other exception is a RuntimeError
carrying the child's traceback; a child that dies without answering (killed, out of memory) is an
EtudeError naming its exit code. `fn` must be a module-level function (spawn pickles it by name).
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from etude.errors import EtudeError

T = TypeVar("T")


def _child(conn: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    try:
        out: tuple[str, Any] = ("ok", fn(*args, **kwargs))
    except EtudeError as e:
        out = ("etude", str(e))
    except KeyboardInterrupt:
        out = ("interrupt", "")
    except BaseException:  # noqa: BLE001 - everything goes back to the parent, nothing is lost here
        out = ("error", traceback.format_exc())
    try:
        conn.send(out)
    except Exception:  # noqa: BLE001 - an unpicklable result: say so instead
        conn.send(("error", f"{getattr(fn, '__name__', fn)} returned something that cannot be pickled:\n"
                            + traceback.format_exc()))
    finally:
        conn.close()


def in_child(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a spawned child process; its result (see the module doc)."""
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args, kwargs), name=f"etude-{getattr(fn, '__name__', 'stage')}")
    proc.start()
    send.close()  # only the child writes: recv sees EOF if it dies
    try:
        try:
            kind, value = recv.recv()
        except EOFError:
            kind, value = "died", None
        proc.join()
    except KeyboardInterrupt:
        proc.join(timeout=30)  # the child got the same Ctrl-C; give it time to save what it has
        if proc.is_alive():
            proc.terminate()
        raise
    finally:
        recv.close()
    if kind == "ok":
        return value
    if kind == "etude":
        raise EtudeError(value)
    if kind == "interrupt":
        raise KeyboardInterrupt
    if kind == "died":
        raise EtudeError(f"{proc.name} exited with code {proc.exitcode} before it finished "
                         "(killed, or out of memory?)")
    raise RuntimeError(f"{proc.name} failed:\n{value}")
