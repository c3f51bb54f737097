"""One chat completion, end to end and independent of HTTP: route, prompt, batch, parse, log.

`ChatService.complete` returns only after the interaction record is committed to the store, so
whatever the HTTP layer sends afterwards (a JSON body or SSE events) describes a durable record.
The record holds: org, user, session, requested model, the checkpoint and policy version that
answered, experiment and arm, sampling parameters, tools, the request messages, prompt and
completion token ids, per-token behaviour log-probs, parse errors, latency, queue time.

Malformed tool calls in the model's output are not errors of the request: they are returned in
`message.etude_parse_errors`, logged in `response.parse_errors`, and distillation scores them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

from etude.errors import EtudeError, NotFound
from etude.feedback.followup_model import EmbeddingFollowupClassifier, classify
from etude.harness import parse_output
from etude.policy.batcher import Batcher, Job
from etude.protocols import native_tools
from etude.serve.api import Answer, ApiError, ChatRequest, to_messages, tool_calls_json, tool_schemas, with_tools_prompt
from etude.serve.config import ServeConfig
from etude.serve.pool import PolicyPool
from etude.serve.router import Route, Router
from etude.store.sql import SQLStore, new_id
from etude.toolcalls import text_format_of
from etude.types import Generation, Message, ParseResult


@dataclass
class Sampling:
    max_tokens: int
    temperature: float
    top_p: float


@dataclass
class Pending:
    """A request that passed validation and routing and is ready for (or in) generation."""

    org: str
    req: ChatRequest
    id: str
    session_id: str
    route: Route
    batcher: Batcher
    job: Job
    sampling: Sampling
    messages: list[Message]
    tools: list[dict[str, Any]]
    t0: float
    created: float


class ChatService:
    def __init__(self, cfg: ServeConfig, store: SQLStore, pool: PolicyPool):
        self.cfg, self.store, self.pool = cfg, store, pool
        self.router = Router(store)
        self._followup_model: Any = None
        self._model_lock = threading.Lock()

    def followup_model(self) -> Any:
        """The optional follow-up classifier, loaded on first use (None: rules only)."""
        if self.cfg.followup_model is None:
            return None
        with self._model_lock:
            if self._followup_model is None:
                self._followup_model = EmbeddingFollowupClassifier(self.cfg.followup_model)
        return self._followup_model

    async def prepare(self, org: str, req: ChatRequest, session: str | None) -> Pending:
        """Validate, route, load and tokenise: everything that can fail as a 4xx happens here,
        before any byte of a (streamed) answer is sent."""
        t0, created = time.perf_counter(), time.time()
        if len(req.messages) > self.cfg.max_messages:
            raise ApiError(400, f"too many messages ({len(req.messages)} > {self.cfg.max_messages})", "messages")
        sampling = self._sampling(req)
        messages, tools = to_messages(req), tool_schemas(req)
        iid = new_id("chatcmpl")
        session_id = session or iid  # no session header: the request is a session of its own
        route = await asyncio.to_thread(self._route, org, req.model, req.user or "", session)
        try:
            batcher = await asyncio.to_thread(self.pool.get, route.checkpoint)
        except EtudeError as e:  # e.g. an adapter rewritten since registration: one line, nothing logged
            raise ApiError(503, f"checkpoint {route.checkpoint.name} cannot be served: {e}",
                           code="checkpoint_unavailable") from None
        if batcher.waiting() >= self.cfg.max_queue:
            raise ApiError(429, f"{route.checkpoint.name} has {batcher.waiting()} requests waiting; retry shortly",
                           code="server_busy")
        job = await asyncio.to_thread(self._job, batcher, messages, tools, sampling)  # tokenising is CPU work
        job.t0, job.client = t0, session
        return Pending(org, req, iid, session_id, route, batcher, job, sampling, messages, tools, t0, created)

    async def finish(self, p: Pending, gen: Generation) -> Answer:
        """Parse the generation, log it, and return only once the record is committed."""
        parsed = self._parse(p.batcher, gen, p.tools, p.id)
        latency = time.perf_counter() - p.t0
        answer = Answer(id=p.id, model=p.route.checkpoint.name, created=int(p.created), parsed=parsed,
                        finish_reason=gen.finish_reason, prompt_tokens=len(gen.prompt_token_ids),
                        completion_tokens=len(gen.token_ids))
        record = self._record(p, gen, answer, latency)
        items = await asyncio.to_thread(self._items, record, p.messages)
        await asyncio.wrap_future(self.store.submit(items))  # durable before we answer
        return answer

    async def complete(self, org: str, req: ChatRequest, session: str | None) -> tuple[Answer, str]:
        """Generate, log durably, and return the answer and the session id used."""
        p = await self.prepare(org, req, session)
        gen = await asyncio.wrap_future(p.batcher.submit(p.job))
        return await self.finish(p, gen), p.session_id

    def _sampling(self, req: ChatRequest) -> Sampling:
        max_tokens = req.max_completion_tokens or req.max_tokens or self.cfg.default_max_tokens
        if max_tokens > self.cfg.max_tokens_limit:
            raise ApiError(400, f"max_tokens {max_tokens} is above this server's limit of {self.cfg.max_tokens_limit}",
                           "max_tokens")
        temp = self.cfg.default_temperature if req.temperature is None else req.temperature
        top_p = self.cfg.default_top_p if req.top_p is None else req.top_p
        return Sampling(max_tokens, temp, top_p)

    def _route(self, org: str, model: str, user: str, session: str | None) -> Route:
        try:
            return self.router.resolve(org, model, user, session)
        except NotFound as e:
            raise ApiError(404, str(e), "model", "model_not_found") from None

    def _job(self, batcher: Batcher, messages: list[Message], tools: list[dict[str, Any]], s: Sampling) -> Job:
        pol = batcher.policy
        prompt_msgs = messages if native_tools(pol) else with_tools_prompt(messages, tools, text_format_of(pol))
        ids = None
        if batcher.by_ids:
            try:
                ids = pol.encode_prompt(prompt_msgs)
            except EtudeError as e:
                raise ApiError(400, str(e), "messages") from None
            limit = pol.context_length()
            if len(ids) >= limit:
                raise ApiError(400, f"the conversation is {len(ids)} tokens; this model's context is {limit}",
                               "messages", "context_length_exceeded")
        return Job(messages=prompt_msgs, prompt_ids=ids, max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p)

    def _parse(self, batcher: Batcher, gen: Generation, tools: list[dict[str, Any]], iid: str) -> ParseResult:
        if gen.tool_calls is not None:  # a backend that parses natively
            return ParseResult(text=gen.text, tool_calls=gen.tool_calls)
        if not tools:
            return ParseResult(text=gen.text)
        names = [t["function"]["name"] for t in tools]
        # call ids unique to this interaction (call_<its id>_0, _1, ...), as OpenAI's are: a text
        # parser numbers a reply's calls from call_0, and the client echoes the ids in its tool messages
        return parse_output(gen.text, text_format_of(batcher.policy), tools=names,
                            id_prefix=f"call_{iid.rsplit('-', 1)[-1]}_")

    def _record(self, p: Pending, gen: Generation, a: Answer, latency: float) -> dict[str, Any]:
        org, req, route, s, meta = p.org, p.req, p.route, p.sampling, p.job.meta
        params = {"temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_tokens, "stream": req.stream,
                  "tool_choice": req.tool_choice, "seed": req.seed, "batch_size": meta.get("batch_size"),
                  "batch_seed": meta.get("batch_seed")}
        response = {"content": a.parsed.text, "tool_calls": tool_calls_json(a.parsed.tool_calls),
                    "parse_errors": list(a.parsed.errors), "raw_text": gen.text}
        # The batcher stamps the first sampled token when the policy exposes its steps (LocalPolicy);
        # otherwise the first token is known only with the whole answer: ttft_s == latency_s.
        ttft = p.job.first_token_at - p.t0 if p.job.first_token_at is not None else latency
        return dict(id=a.id, org_id=org, user_id=req.user or "", session_id=p.session_id, model=req.model,
                    checkpoint=route.checkpoint.name, policy_version=int(gen.policy_version or route.checkpoint.version),
                    experiment_id=route.experiment_id, arm=route.arm, created_at=p.created, params=params,
                    response=response, finish_reason=a.openai_finish, prompt_token_ids=list(gen.prompt_token_ids),
                    completion_token_ids=list(gen.token_ids), logprobs=list(gen.logprobs),
                    prompt_tokens=a.prompt_tokens, completion_tokens=a.completion_tokens, latency_s=latency,
                    ttft_s=ttft, queue_s=meta.get("queue_s"), tools=p.tools,
                    messages=[_message_dict(m) for m in p.messages])

    def _items(self, record: dict[str, Any], messages: list[Message]) -> list[tuple[str, dict[str, Any]]]:
        """The interaction, plus (when it is a follow-up) its label and a feedback event on the
        previous interaction of the session: written together, in one commit."""
        followup = self._followup(record, messages) if self.cfg.classify_followups else None
        if followup is None:
            return [("interaction", record)]
        pos, label, prev, source = followup
        record["messages"][pos].update(label=label, label_source=source)
        return [("interaction", record), ("feedback", {
            "org_id": record["org_id"], "interaction_id": prev, "kind": "followup",
            "value": 1.0 if label == "dissatisfied" else 0.0, "source": "server",
            "data": {"label": label, "label_source": source, "message_interaction_id": record["id"],
                     "position": pos}})]

    def _followup(self, record: dict[str, Any], messages: list[Message]) -> tuple[int, str, str, str] | None:
        # The user's last message, when it follows an earlier answer of the same session, is the
        # follow-up to that answer: I label it here and attach the verdict to that interaction.
        if not messages or messages[-1].role != "user":
            return None
        prev = self.store.last_in_session(record["org_id"], record["session_id"])
        if prev is None:
            return None
        prev_id, earlier = prev
        label, source = classify(messages[-1].content, earlier, self.followup_model())
        return len(messages) - 1, label, prev_id, source


def _message_dict(m: Message) -> dict[str, Any]:
    return {"role": m.role, "content": m.content, "tool_calls": [c.to_dict() for c in m.tool_calls],
            "tool_call_id": m.tool_call_id}
