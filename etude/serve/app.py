"""The HTTP server: FastAPI routes over `ChatService`, auth, bounded bodies, OpenAI errors.

Routes: GET /health (no key), GET /v1/models, POST /v1/chat/completions, POST /v1/feedback,
GET /v1/interactions/{id}, and the HTML /dashboard (etude.serve.dashboard: Bearer key or a
login form's session cookie). Everything under /v1 needs `Authorization: Bearer <key>`; the key
names the organisation, and every read and write is scoped to it (a foreign interaction id
answers 404, exactly like an unknown one).

Headers: the client may send `x-etude-session` (a session id; default: each request is its own
session); the user is the body's `user` field. Responses carry `x-etude-interaction-id` (also the
body's `id`), `x-etude-checkpoint` and `x-etude-session`.

Acknowledgement: a non-streamed 200 is sent only after the interaction's record is committed.
A streamed answer sends text as it is sampled, but its finish chunk (and `[DONE]`) only after
the commit: a stream that ended without its finish chunk was not acknowledged.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from etude.errors import EtudeError, NotFound
from etude.feedback.followup_model import classify
from etude.policy.local import decode_reply
from etude.protocols import TokenizerPolicy
from etude.serve import registry
from etude.serve.api import (
    ApiError,
    completion_body,
    content_chunk,
    load_json_object,
    parse_request,
    role_chunk,
    sse,
    stream_chunks,
)
from etude.serve.config import ServeConfig
from etude.serve.dashboard import add_dashboard
from etude.serve.dashboard_data import ReadoutFn
from etude.serve.pool import PolicyPool
from etude.serve.service import ChatService, Pending
from etude.store.sql import FEEDBACK_KINDS, SQLStore
from etude.toolcalls import CALL_TAG, text_format_of

_PIECE = re.compile(r"\S+\s*|\s+")


def create_app(cfg: ServeConfig, store: SQLStore, pool: PolicyPool, *, readout: ReadoutFn | None = None) -> FastAPI:
    """The app; `readout` computes the dashboard's live A/B readout (see etude.serve.dashboard_data)."""
    service = ChatService(cfg, store, pool)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if cfg.preload:
            prod = registry.production(store, None)
            if prod is not None:
                await asyncio.to_thread(pool.get, prod)
        yield
        pool.close()

    app = FastAPI(title="etude", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.store, app.state.pool = store, pool
    add_dashboard(app, store, readout)

    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, e: Exception) -> JSONResponse:
        # Last resort: the client gets one line, not a traceback (the server log has the rest).
        return JSONResponse(ApiError(500, f"internal error: {type(e).__name__}: {e}").body(), status_code=500)

    async def org_of(request: Request) -> str:
        auth = request.headers.get("authorization", "")
        if not auth.lower().startswith("bearer ") or not auth[7:].strip():
            raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>' (create one with `etude keys create`)",
                           code="invalid_api_key")
        org = await asyncio.to_thread(store.authenticate, auth[7:].strip())
        if org is None:
            raise ApiError(401, "invalid API key", code="invalid_api_key")
        return org

    async def body_of(request: Request) -> bytes:
        limit = cfg.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body is {declared} bytes; the limit is {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body is over the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        await asyncio.to_thread(store.count_interactions, "")  # the database answers
        return {"status": "ok", "loaded": pool.loaded(), "batching": pool.stats()}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        org = await org_of(request)
        cps = await asyncio.to_thread(registry.list_checkpoints, store, org, include_retired=False)
        data = [{"id": "auto", "object": "model", "created": 0, "owned_by": "etude"}]
        data += [{"id": c.name, "object": "model", "created": int(c.created_at), "owned_by": c.org_id or "etude",
                  "etude": {"state": c.state, "version": c.version}} for c in cps]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        org = await org_of(request)
        req = parse_request(await body_of(request))
        session = request.headers.get("x-etude-session") or None
        if session is not None and len(session) > 256:
            raise ApiError(400, "x-etude-session is longer than 256 characters")
        pending = await service.prepare(org, req, session)
        headers = {"x-etude-interaction-id": pending.id, "x-etude-checkpoint": pending.route.checkpoint.name,
                   "x-etude-session": pending.session_id}
        if not req.stream:
            gen = await asyncio.wrap_future(pending.batcher.submit(pending.job))
            answer = await service.finish(pending, gen)
            return JSONResponse(completion_body(answer), headers=headers)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_stream(service, pending, include_usage), media_type="text/event-stream",
                                 headers=headers)

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> Any:
        org = await org_of(request)
        body = await body_of(request)
        record = await asyncio.to_thread(_feedback_record, org, body, service.followup_model())
        if record["interaction_id"] is None:  # named by session: the session's newest interaction
            last = await asyncio.to_thread(store.last_in_session, org, record.pop("session_id"))
            if last is None:
                raise ApiError(404, "no interaction in that session", "session_id")
            record["interaction_id"] = last[0]
        record.pop("session_id", None)
        try:
            fid = await asyncio.to_thread(store.log_feedback, record)
        except NotFound as e:
            raise ApiError(404, str(e), "interaction_id") from None
        except EtudeError as e:
            raise ApiError(400, str(e)) from None
        return {"id": fid, "object": "feedback", "interaction_id": record["interaction_id"], "kind": record["kind"],
                "value": record["value"], "data": record["data"]}

    @app.get("/v1/interactions/{interaction_id}")
    async def interaction(interaction_id: str, request: Request) -> Any:
        org = await org_of(request)
        try:
            return await asyncio.to_thread(store.interaction, org, interaction_id)
        except NotFound as e:
            raise ApiError(404, str(e)) from None

    return app


async def _stream(service: ChatService, p: Pending, include_usage: bool) -> AsyncIterator[bytes]:
    """SSE: text as it is sampled (when the policy exposes its steps), then — only after the
    record is committed — the rest of the text, the tool calls, the finish reason, usage, [DONE].
    A client that did not get the finish chunk was not acknowledged."""
    loop = asyncio.get_running_loop()
    tokens: asyncio.Queue[int | None] = asyncio.Queue()
    pol = p.batcher.policy
    visible = VisibleText(pol.tokenizer if isinstance(pol, TokenizerPolicy) else None, hold_tool_calls=bool(p.tools),
                          fmt=text_format_of(pol))
    if p.batcher.steps_visible and visible.tokenizer is not None:
        p.job.on_token = lambda tok: loop.call_soon_threadsafe(tokens.put_nowait, tok)
    fut = asyncio.wrap_future(p.batcher.submit(p.job))
    fut.add_done_callback(lambda _f: tokens.put_nowait(None))
    # The record is written by a task of its own, so a client that hangs up mid-stream does not
    # cancel it: the sample (and its log-probs) is still logged, just never acknowledged.
    logged = asyncio.ensure_future(_finish_when_generated(service, p, fut))
    yield role_chunk(p.id, p.route.checkpoint.name)
    while (tok := await tokens.get()) is not None:
        delta = visible.add(tok)
        if delta:
            yield content_chunk(p.id, p.route.checkpoint.name, delta)
    try:
        answer = await asyncio.shield(logged)
    except Exception as e:  # headers are gone: the error becomes an event, and there is no [DONE]
        body = e.body() if isinstance(e, ApiError) else ApiError(500, f"internal error: {type(e).__name__}: {e}").body()
        yield sse(body)
        return
    rest = answer.parsed.text[len(visible.sent):] if answer.parsed.text.startswith(visible.sent) else ""
    for event in stream_chunks(answer, _PIECE.findall(rest), include_usage, with_role=False):
        yield event


async def _finish_when_generated(service: ChatService, p: Pending, fut: Any) -> Any:
    return await service.finish(p, await fut)


class VisibleText:
    """Incremental decoding of streamed tokens into the text a client may see now: everything
    before the first call of the model's text format `fmt` (`<tool_call>`, `[TOOL_CALLS]`; a
    Llama 3.x reply that opens with `{` or `<|python_tag|>` is all call), with a suffix that could
    be the start of that tag, or half a UTF-8 character, held back. Tool calls go out as
    `tool_calls` chunks once parsed."""

    def __init__(self, tokenizer: Any, hold_tool_calls: bool, fmt: str = "hermes"):
        self.tokenizer, self.hold, self.fmt = tokenizer, hold_tool_calls, fmt
        self.OPEN = CALL_TAG[fmt]
        self.ids: list[int] = []
        self.sent = ""
        self.stopped = False

    def add(self, tok: int) -> str:
        if self.stopped:
            return ""
        self.ids.append(tok)
        text = decode_reply(self.tokenizer, self.ids)
        if text.endswith("\ufffd"):
            return ""
        if self.hold:
            text = self._before_tag(text)
        if not text.startswith(self.sent):  # decoding revised earlier text (rare): wait for the end
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta

    def _before_tag(self, text: str) -> str:
        if self.fmt == "llama3_json":  # calls are the whole reply: hold it until it cannot be one
            head = text.lstrip()
            if head.startswith("{") or head.startswith(self.OPEN):
                self.stopped = True
                return ""
            return "" if self.OPEN.startswith(head) else text
        cut = text.find(self.OPEN)
        if cut >= 0:
            self.stopped = True
            return text[:cut]
        for k in range(min(len(self.OPEN) - 1, len(text)), 0, -1):
            if self.OPEN.startswith(text[-k:]):
                return text[:-k]
        return text


def _feedback_record(org: str, body: bytes, model: Any = None) -> dict[str, Any]:
    """Validate a /v1/feedback body: {"interaction_id" | "session_id", "kind", "value"?, "data"?}."""
    d = load_json_object(body)
    iid, sid = d.get("interaction_id"), d.get("session_id")
    if not isinstance(iid, str) and not isinstance(sid, str):
        raise ApiError(400, "feedback needs a string interaction_id (or session_id)", "interaction_id")
    kind = d.get("kind")
    if kind not in FEEDBACK_KINDS:
        raise ApiError(400, f"kind must be one of {', '.join(FEEDBACK_KINDS)}", "kind")
    value, data = d.get("value"), d.get("data") or {}
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ApiError(400, "value must be a number or null", "value")
    if not isinstance(data, dict):
        raise ApiError(400, "data must be a JSON object", "data")
    if kind == "edit_persistence" and (value is None or not 0.0 <= value <= 1.0):
        raise ApiError(400, "edit_persistence needs a value in [0, 1] (the surviving share)", "value")
    if kind == "followup":
        value, data = _classify_followup(value, data, model)
    return {"org_id": org, "interaction_id": iid if isinstance(iid, str) else None, "session_id": sid,
            "kind": kind, "value": value, "data": data, "source": "client"}


def _classify_followup(value: Any, data: dict[str, Any], model: Any = None) -> tuple[Any, dict[str, Any]]:
    # A client may send the follow-up text and let the server label it, or a label itself.
    label = data.get("label")
    if label is None:
        text = data.get("text")
        if not isinstance(text, str):
            raise ApiError(400, "followup feedback needs data.text (the next user message) or data.label", "data")
        previous = data.get("previous") if isinstance(data.get("previous"), str) else None
        label, source = classify(text, previous, model)
        data = {**data, "label": label, "label_source": source}
    if label not in ("dissatisfied", "neutral", "satisfied"):
        raise ApiError(400, "data.label must be dissatisfied, neutral or satisfied", "data")
    return (1.0 if label == "dissatisfied" else 0.0) if value is None else value, data
