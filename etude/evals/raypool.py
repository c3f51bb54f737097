"""Evaluation episodes on Ray: each episode a Ray task with its own sandbox, the policy in one actor.

`RayEpisodes` is the "ray" executor of `run_eval` (EvalConfig.executor, the default):

- Ray: `ray.init(address="local")` starts a local Ray for the run, stopped when it ends; `ray_address`
  ("HOST:PORT" of `ray start --head`, or "auto") joins a cluster instead, and a Ray this process
  already joined is used as it is (and left running). An address where nothing answers is one
  EtudeError line (exit 2 in the CLI), found by a TCP connect before `ray.init`, which would
  otherwise retry for minutes.
- The policy: one actor (`PolicyServer`) builds it from the model spec, exactly as the thread
  pool does (etude.evals.models.policy_factory), placed on the driver's node when it can be. It
  is threaded with `max_concurrency = workers`, so a local model's `BatchedPolicy` still groups
  the turns of concurrent episodes into one forward. Per-episode policies (oracle, noop,
  scripted) live there too, one per open episode.
- An episode: a Ray task (`ray_task_cpus` CPUs, spread over the nodes) that runs
  `episode_record` — fresh workspace, harness, grading, scores — with an `ActorPolicy`, a proxy
  implementing `protocols.Policy` whose `generate` calls the actor. Its trajectory is written on
  the worker's node under a temporary folder and travels back with the record, so a cluster needs
  no shared filesystem; the driver writes both into the run folder. Records gain `node_id`, the
  Ray node that ran the episode; `pid` is the Ray worker's.

Guarantees: at most `workers` episode tasks are submitted at a time, so on Ctrl-C (or any error
in the driver) the queued episodes were never started and the ones in flight are waited for and
recorded; a task whose worker or node died is recorded as an infrastructure error (status
"error", rerun on resume) and is not retried by Ray. An exception raised by the policy reaches the
harness as the policy's own exception (not Ray's wrapper), so records read as with threads.
Not guaranteed: Ray workers see the environment of the node they run on (a local Ray inherits
this process's; a cluster's nodes have what `ray start` had), so ETUDE_CACHE and friends must be
set there; the policy actor reserves no CPU or GPU (a GPU model on a cluster is untested); an
address whose port answers but is not a Ray GCS makes `ray.init` retry for a long time.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.evals.config import EvalConfig
from etude.evals.episode import episode_record, error_record, trajectory_path
from etude.evals.models import policy_factory
from etude.evals.records import atomic_write
from etude.policy.batcher import BatchedPolicy
from etude.protocols import NativeToolsPolicy, native_tools, policy_name
from etude.raycluster import connect, failure, run_bounded
from etude.raycluster import ray_get as _get
from etude.raycluster import ray_module as _ray
from etude.types import Generation, Message, Task


class PolicyServer:
    """Body of the policy actor: the policies of the open episodes, built by the eval's factory."""

    def __init__(self, spec: str, model_name: str | None, backend: str):
        self.error: tuple[bool, str] | None = None  # (is an EtudeError, message), shown by the driver
        self.factory: Callable[[Task, int], Any] | None = None
        try:
            self.factory = policy_factory(spec, model_name, backend)
        except EtudeError as e:  # reported by ready(), raised in the driver as the thread pool would
            self.error = (True, str(e))
        except Exception as e:  # noqa: BLE001 - the same, for a failure that is not the user's input
            self.error = (False, f"{type(e).__name__}: {e}")
        _use_every_core()
        self.policies: dict[str, Any] = {}
        self.lock = threading.Lock()

    def ready(self) -> tuple[bool, str] | None:
        return self.error

    def open(self, task: Task, sample: int) -> tuple[str, str, int, bool]:
        """A policy for one episode: (key, id, version, native_tools)."""
        assert self.factory is not None
        policy = self.factory(task, sample)
        key = uuid.uuid4().hex
        with self.lock:
            self.policies[key] = policy
        return key, *policy_name(policy), native_tools(policy)

    def generate(self, key: str, messages: list[Message], tools: list[dict[str, Any]], max_tokens: int,
                 temperature: float) -> Generation:  # fmt: skip
        # NOTE: a BatchedPolicy names the batcher's client after the calling thread; Ray's pool
        # threads serve any episode, so I name the thread after the episode for this call.
        threading.current_thread().name = f"episode-{key[:12]}"
        return self.policies[key].generate(messages, tools, max_tokens=max_tokens, temperature=temperature)

    def close(self, key: str) -> None:
        with self.lock:
            self.policies.pop(key, None)

    def stats(self) -> dict[str, Any]:
        """Open episodes, and the batcher's counts when the policy is a shared BatchedPolicy."""
        with self.lock:
            policies = list(self.policies.values())
        batcher = policies[0].batcher if policies and isinstance(policies[0], BatchedPolicy) else None
        return {"open": len(policies), **(vars(batcher.stats) if batcher is not None else {})}


def _use_every_core() -> None:
    # NOTE: Ray sets OMP_NUM_THREADS=1 in an actor that reserves no CPU, so torch would run a local
    # model on one thread; in-process (threads executor) it uses every core, as here.
    if "torch" in sys.modules:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        sys.modules["torch"].set_num_threads(max(1, cores))


class ActorPolicy(NativeToolsPolicy):
    """A `protocols.Policy` whose `generate` runs on the policy actor, for one episode."""

    def __init__(self, server: Any, key: str, id: str, version: int, native_tools: bool):
        self.server, self.key = server, key
        self.id, self.version, self.native_tools = id, version, native_tools

    @classmethod
    def open(cls, server: Any, task: Task, sample: int) -> ActorPolicy:
        return cls(server, *_get(server.open.remote(task, sample)))

    def generate(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], *, max_tokens: int = 512,
                 temperature: float = 0.7) -> Generation:  # fmt: skip
        return _get(self.server.generate.remote(self.key, list(messages), list(tools), max_tokens, temperature))

    def close(self) -> None:
        self.server.close.remote(self.key)


def _episode(task: Task, sample: int, server: Any, cfg: EvalConfig, model: str) -> tuple[dict[str, Any], str | None]:
    """Body of an episode task: (the record, the trajectory file's text or None)."""
    opened: list[ActorPolicy] = []

    def factory(t: Task, k: int) -> ActorPolicy:
        opened.append(ActorPolicy.open(server, t, k))
        return opened[-1]

    with tempfile.TemporaryDirectory(prefix="etude-ray-episode-") as tmp:
        try:
            rec = episode_record(task, sample, factory, cfg, Path(tmp), model)
        finally:
            for p in opened:
                p.close()
        path = Path(tmp) / trajectory_path(task, sample)
        text = path.read_text(encoding="utf-8") if path.is_file() else None
    return {**rec, "node_id": _ray().get_runtime_context().get_node_id()}, text


class RayEpisodes:
    """The "ray" executor of run_eval (see the module docstring)."""

    def __init__(self, model: str, cfg: EvalConfig, out: Path):
        self.model, self.cfg, self.out = model, cfg, out
        self.ray = ray = _ray()
        self.started = connect(cfg.ray_address)
        self.server: Any = None
        try:
            self.server = self._start_server()
            self.cfg_ref = ray.put(cfg)
            self.task = ray.remote(_episode).options(num_cpus=cfg.ray_task_cpus, max_retries=0,
                                                     scheduling_strategy="SPREAD")  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _start_server(self) -> Any:
        ray = self.ray
        opts: dict[str, Any] = {"num_cpus": 0, "max_concurrency": self.cfg.workers}
        try:  # beside the driver, where the thread pool would have loaded it (and its GPU is)
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here = ray.get_runtime_context().get_node_id()
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=here, soft=True)
        except Exception:  # noqa: BLE001 - a Ray Client driver is on no node: let Ray place it
            pass
        server = ray.remote(PolicyServer).options(**opts).remote(self.model, self.cfg.model_name, self.cfg.backend)
        error = ray.get(server.ready.remote())
        if error is not None:
            ray.kill(server)
            is_etude, message = error
            if is_etude:
                raise EtudeError(message)
            raise RuntimeError(f"the policy actor could not load {self.model!r}: {message}")
        return server

    def run(self, todo: list[tuple[Task, int]], record: Callable[[dict[str, Any]], None]) -> None:
        """The episodes through `raycluster.run_bounded`: on Ctrl-C or an error the queued ones
        never start; those in flight finish and are recorded."""
        started: dict[tuple[str, int], float] = {}

        def submit(job: tuple[Task, int]) -> Any:
            t, k = job
            started[(t.instance_id, k)] = time.monotonic()
            return self.task.remote(t, k, self.server, self.cfg_ref, self.model)

        def finish(job: tuple[Task, int], ref: Any) -> None:
            self._finish(ref, (*job, started[(job[0].instance_id, job[1])]), record)

        run_bounded(todo, submit, finish, self.cfg.workers)

    def _finish(self, ref: Any, job: tuple[Task, int, float], record: Callable[[dict[str, Any]], None]) -> None:
        task, sample, t0 = job
        try:
            rec, text = _get(ref)
        except Exception as e:  # noqa: BLE001 - a dead worker or node fails its episode, not the run
            record(error_record(task, sample, self.model, failure(e), time.monotonic() - t0, None))
            return
        if text is not None:  # the trajectory first: a record never names a missing file
            path = self.out / trajectory_path(task, sample)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, text)
        record(rec)

    def close(self) -> None:
        if self.server is not None:
            self.ray.kill(self.server)
            self.server = None
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()
            self.started = False
