"""Batched generation: one worker thread per loaded checkpoint turns concurrent requests into
`generate_ids` / `generate_batch` calls.

The worker takes the first waiting job, then keeps collecting while jobs keep arriving less than
`wait_ms` apart, for at most `max_wait_ms` after the first (or until `max_batch` jobs): a burst
of requests that trickles in over a few tens of milliseconds (one event loop parses them one by
one) still lands in one batch, while a lone request waits only `wait_ms`. While the batch is
smaller than the number of sessions answered within the last two batch times, it waits longer
(up to a quarter of the last batch's generation time, at most 1 s) for those clients to return,
so closed-loop clients (agents in a session) that fell out of step merge into one batch again.
Requests without a session header never cause that wait; a session that stops sending costs
the wait for at most two batch times. It groups them by sampling parameters (temperature, top_p) and runs each group
as one batch. Jobs in a group may ask for different `max_tokens`: the batch runs to the largest
and each row is cut to its own limit afterwards. A cut row is still an exact sample of its
first k tokens, so its log-probs stay valid behaviour log-probs.

Policies with `encode_prompt` + `generate_ids` (LocalPolicy) are batched on token ids; any other
`protocols.Policy` is called through `generate_batch` if it has one, else one `generate` per job.
Not guaranteed: fairness beyond FIFO within a window; a batch in progress is never pre-empted.

`EngineQueue` has the Batcher's interface for a policy that batches by itself (a
`protocols.SubmitPolicy`, vLLM): each job goes to the engine the moment it is submitted, with no
cap of its own, and returns when it alone is done.
"""

from __future__ import annotations

import dataclasses
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from etude.policy.local import decode_reply
from etude.protocols import (
    BatchPolicy,
    EngineStatsPolicy,
    ModelPolicy,
    NativeToolsPolicy,
    SubmitPolicy,
    TokenizerPolicy,
    TokenPolicy,
    native_tools,
    policy_name,
)
from etude.types import Generation, Message


@dataclass
class Job:
    messages: Sequence[Message]
    prompt_ids: list[int] | None  # set when the policy encodes prompts itself (LocalPolicy)
    max_tokens: int
    temperature: float
    top_p: float | None  # None: the policy's default
    future: Future[Generation] = field(default_factory=Future)
    enqueued: float = field(default_factory=time.perf_counter)
    meta: dict[str, Any] = field(default_factory=dict)  # queue_s, batch_size; set before the result
    on_token: Callable[[int], None] | None = None  # called from the worker thread per sampled token
    client: str | None = None  # the session that sent it, if it named one (see Batcher._collect)
    first_token_at: float | None = None  # perf_counter() when its first token was sampled
    t0: float = 0.0


@dataclass
class BatchStats:
    batches: int = 0  # generate calls (EngineQueue: the engine's steps)
    jobs: int = 0  # requests answered
    max_batch_seen: int = 0  # the most requests in one batch (EngineQueue: in flight at once)
    seqs: int = 0  # requests summed over batches, so seqs / batches is the mean batch (Batcher: = jobs)


class Batcher:
    """Queue + worker thread for one policy (see module docstring)."""

    def __init__(self, policy: Any, *, max_batch: int = 16, wait_ms: float = 5.0, max_wait_ms: float = 50.0,
                 stop_ids: Sequence[int] = ()):
        self.policy = policy
        self.max_batch = max_batch
        self.wait_s = wait_ms / 1000.0
        self.max_wait_s = max(max_wait_ms, wait_ms) / 1000.0
        self.stats = BatchStats()
        self._stop_ids = set(stop_ids or (policy.stop_token_ids if isinstance(policy, TokenPolicy) else ()) or ())
        self._q: queue.Queue[Job | None] = queue.Queue()
        self._closed = False
        self._answered: deque[tuple[float, str]] = deque(maxlen=4 * max_batch)  # (when, client) of answered jobs
        self._last_gen_s = 0.0  # generation time of the last batch
        self._streamer: Any = None  # the step hook of the batch in progress (see _install_step_hook)
        self._by_ids = isinstance(policy, TokenPolicy)  # checked once: a batcher keeps its policy
        self.steps_visible = self.by_ids and self._install_step_hook()
        self._thread = threading.Thread(target=self._loop, name=f"batcher-{policy_name(policy)[0] or '?'}", daemon=True)
        self._thread.start()

    @property
    def by_ids(self) -> bool:
        return self._by_ids

    def waiting(self) -> int:
        return self._q.qsize()

    def submit(self, job: Job) -> Future[Generation]:
        if self._closed:
            raise RuntimeError("this checkpoint was unloaded; retry the request")
        self._q.put(job)
        return job.future

    def close(self) -> None:
        self._closed = True
        self._q.put(None)
        self._thread.join(timeout=30)

    def _collect(self, first: Job) -> list[Job]:
        start = time.perf_counter()
        target = self._expected_clients(start)
        jobs = [first]
        while len(jobs) < self.max_batch:
            deadline = self._deadline(start, len(jobs) < target)
            left = deadline - time.perf_counter()
            try:
                job = self._q.get(timeout=max(left, 0)) if left > 0 else self._q.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self._q.put(None)  # let the loop see the stop after this batch
                break
            jobs.append(job)
        return jobs

    def _expected_clients(self, now: float) -> int:
        """Distinct clients (sessions) answered within the last two batch times: those are likely
        to be back in a moment, so a batch smaller than this is worth a short wait."""
        horizon = now - 2 * self._last_gen_s
        return max(1, min(self.max_batch, len({c for t, c in self._answered if t >= horizon})))

    def _deadline(self, start: float, below_target: bool) -> float:
        # Below the number of recently answered sessions, I wait for those clients to come
        # back (closed-loop clients return tens of ms after their answer, more on a busy machine),
        # up to max(max_wait, a quarter of the last batch's generation time, at most 1 s);
        # otherwise only while arrivals keep coming less than wait_ms apart. Without this, groups
        # of clients that fell out of step stay in separate batches forever.
        if below_target:  # a quarter of a batch's time is worth waiting to avoid a whole extra batch
            return start + max(self.max_wait_s, min(1.0, 0.25 * self._last_gen_s))
        return min(start + self.max_wait_s, time.perf_counter() + self.wait_s)

    def _loop(self) -> None:
        while True:
            first = self._q.get()
            if first is None:
                return
            jobs = self._collect(first)
            groups: dict[tuple[float, float | None], list[Job]] = {}
            for j in jobs:
                groups.setdefault((j.temperature, j.top_p), []).append(j)
            for (temp, top_p), group in groups.items():
                self._run(group, temp, top_p)

    def _run(self, group: list[Job], temperature: float, top_p: float | None) -> None:
        started = time.perf_counter()
        try:
            gens = self._generate(group, temperature, top_p)
        except BaseException as e:  # every waiting request gets the error, the worker lives on
            for j in group:
                j.future.set_exception(e)
            return
        self._last_gen_s = time.perf_counter() - started
        self.stats.batches += 1
        self.stats.jobs += len(group)
        self.stats.seqs += len(group)
        self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(group))
        for j, g in zip(group, gens, strict=True):
            j.meta.update(queue_s=started - j.enqueued, batch_size=len(group))
            if j.client:
                self._answered.append((time.perf_counter(), j.client))
            j.future.set_result(self._cut(g, j.max_tokens))

    def _install_step_hook(self) -> bool:
        # NOTE: LocalPolicy has no per-step callback, so I hand transformers' documented
        # `streamer=` argument to its model's generate() through a wrapper installed here (the
        # server owns this policy object; only this worker thread generates with it). A
        # streamer receives the prompt once, then one (batch,) tensor of new tokens per step.
        if not isinstance(self.policy, ModelPolicy) or not callable(getattr(self.policy.model, "generate", None)):
            return False
        model = self.policy.model
        generate = model.generate

        def with_streamer(*args: Any, **kwargs: Any) -> Any:
            if self._streamer is not None and kwargs.get("streamer") is None:
                kwargs["streamer"] = self._streamer
            return generate(*args, **kwargs)

        model.generate = with_streamer
        return True

    def _generate(self, group: list[Job], temperature: float, top_p: float | None) -> list[Generation]:
        max_tokens = max(j.max_tokens for j in group)
        if self.by_ids:
            self._streamer = _step_streamer(group, self._stop_ids) if self.steps_visible else None
            # NOTE: LocalPolicy restores the global RNG after each call (fork_rng), so without a
            # seed every call draws the same random numbers: identical prompts would get identical
            # "samples". I give each batch a fresh seed and log it (params.batch_seed).
            seed = secrets.randbits(31)
            for j in group:
                j.meta["batch_seed"] = seed
            try:
                return list(self.policy.generate_ids([j.prompt_ids for j in group], max_tokens=max_tokens,
                                                     temperature=temperature, top_p=top_p, seed=seed))
            finally:
                self._streamer = None
        if isinstance(self.policy, BatchPolicy):
            return list(self.policy.generate_batch([j.messages for j in group], [], max_tokens=max_tokens,
                                                   temperature=temperature))
        return [self.policy.generate(j.messages, [], max_tokens=j.max_tokens, temperature=temperature) for j in group]

    def _cut(self, g: Generation, max_tokens: int) -> Generation:
        if len(g.token_ids) <= max_tokens:
            return g
        ids = g.token_ids[:max_tokens]
        tok = self.policy.tokenizer if isinstance(self.policy, TokenizerPolicy) else None
        text = decode_reply(tok, ids) if tok is not None else g.text
        return dataclasses.replace(g, text=text, token_ids=ids, logprobs=g.logprobs[:max_tokens], finish_reason="length")


class EngineQueue:
    """The Batcher's interface (`submit`, `waiting`, `stats`, `close`) in front of a policy that
    batches by itself (`protocols.SubmitPolicy`: a vLLM engine with continuous batching).

    # NOTE: I do not batch in front of such an engine. vLLM adds each request to its running batch
    # at its next step and returns it when it is done, up to its own max_num_seqs. A Batcher in
    # front of it would cap the requests in flight at max_batch (at 64 sessions, 48 queue and the
    # p50 latency quadruples), make every request of a batch wait for the longest one and newcomers
    # wait for the whole batch, and run two checkpoints on one engine (production and an org's
    # adapter during a canary) one batch after the other instead of together.

    `waiting()` counts this checkpoint's requests in flight (handed over, not yet answered), which
    the server's max_queue caps. A job's meta gets `batch_size` = that count when it was handed
    over; there is no queue_s (vLLM queues internally), and no per-token hook (steps_visible is
    False: a streamed answer comes whole at the end)."""

    by_ids = True  # jobs carry prompt token ids (the server renders them with policy.encode_prompt)
    steps_visible = False

    def __init__(self, policy: SubmitPolicy):
        self.policy = policy
        self._jobs = 0
        self._max_in_flight = 0
        self._in_flight = 0
        self._closed = False
        self._cv = threading.Condition()

    def waiting(self) -> int:
        with self._cv:
            return self._in_flight

    def submit(self, job: Job) -> Future[Generation]:
        if self._closed:
            raise RuntimeError("this checkpoint was unloaded; retry the request")
        with self._cv:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            job.meta["batch_size"] = self._in_flight
        try:
            inner = self.policy.submit_ids(job.prompt_ids, max_tokens=job.max_tokens, temperature=job.temperature,
                                           top_p=job.top_p)
        except BaseException:
            self._done()
            raise
        inner.add_done_callback(lambda f: self._resolve(job, f))
        return job.future

    @property
    def stats(self) -> BatchStats:
        """This checkpoint's answered requests and most in flight; batches and seqs are the
        engine's steps and requests per step (shared by every checkpoint on that engine)."""
        eng = self.policy.engine_stats() if isinstance(self.policy, EngineStatsPolicy) else {}
        with self._cv:
            return BatchStats(batches=int(eng.get("steps", 0)), jobs=self._jobs, max_batch_seen=self._max_in_flight,
                              seqs=int(eng.get("seqs", 0)))

    def close(self, timeout_s: float = 30.0) -> None:
        """Take no more jobs; wait (up to timeout_s) for those in flight to be answered."""
        self._closed = True
        with self._cv:
            self._cv.wait_for(lambda: self._in_flight == 0, timeout=timeout_s)

    def _resolve(self, job: Job, f: Future[Generation]) -> None:
        self._done(answered=True)
        err = f.exception()
        if err is not None:
            job.future.set_exception(err)
        else:
            job.future.set_result(f.result())

    def _done(self, answered: bool = False) -> None:
        with self._cv:
            self._in_flight -= 1
            self._jobs += answered
            self._cv.notify_all()


def _step_streamer(jobs: list[Job], stop_ids: set[int]) -> Any:
    """A transformers streamer that stamps each row's first token and feeds `on_token`."""
    from transformers.generation.streamers import BaseStreamer

    class RowStreamer(BaseStreamer):
        def __init__(self) -> None:
            self.seen_prompt = False
            self.count = [0] * len(jobs)
            self.done = [False] * len(jobs)

        def put(self, value: Any) -> None:
            if not self.seen_prompt:  # the first call is the prompt batch
                self.seen_prompt = True
                return
            now = time.perf_counter()
            for r, tok in enumerate(value.reshape(-1).tolist()[: len(jobs)]):
                job = jobs[r]
                if self.done[r]:
                    continue
                if job.first_token_at is None:
                    job.first_token_at = now
                if tok in stop_ids or self.count[r] >= job.max_tokens:
                    self.done[r] = True
                    continue
                self.count[r] += 1
                if job.on_token is not None:
                    job.on_token(int(tok))

        def end(self) -> None:
            pass

    return RowStreamer()


class BatchedPolicy(NativeToolsPolicy):
    """A `Policy` whose concurrent `generate` calls — one per episode thread, as in evaluation, RL
    rollouts and simulated users — run as batches on one model through a `Batcher`. Each thread
    names itself as the batcher's client, so closed-loop episodes that fell out of step (one was
    running its tests) merge into one batch again. Everything else is the wrapped policy's."""

    def __init__(self, policy: Any, *, max_batch: int = 16, wait_ms: float = 20.0, max_wait_ms: float = 200.0):
        self.inner = policy
        self.batcher = Batcher(policy, max_batch=max_batch, wait_ms=wait_ms, max_wait_ms=max_wait_ms)

    # NOTE: no __getattr__ forwarding to the inner policy: what a BatchedPolicy can do is declared
    # here (Policy, NativeToolsPolicy), so the capability protocols' isinstance answers the same on
    # Python 3.11 (hasattr) and 3.12+ (getattr_static). Reach the wrapped policy through `inner`.
    @property
    def native_tools(self) -> bool:
        return native_tools(self.inner)

    @property
    def id(self) -> str:
        return self.inner.id

    @property
    def version(self) -> int:
        return self.inner.version

    def generate(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = (), *, max_tokens: int = 512,
                 temperature: float = 0.7, top_p: float | None = None, **_: Any) -> Generation:
        job = Job(messages, self.inner.encode_prompt(messages), max_tokens, temperature,
                  top_p,  # None: the policy's own default (generate_ids reads it)
                  client=threading.current_thread().name)
        return self.batcher.submit(job).result()

    def close(self) -> None:
        self.batcher.close()


def batchable(policy: Any) -> bool:
    """Whether `policy` can sit behind a BatchedPolicy: it renders prompts and samples from ids."""
    return isinstance(policy, TokenPolicy)
