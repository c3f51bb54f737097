"""`/dashboard`: one HTML page to watch the real-time loop (no build step, no JavaScript).

Routes:
- `GET /dashboard`: the page for the caller's key, sent as `Authorization: Bearer KEY` (scripts,
  tests) or through the session cookie a browser got from the login form; without either, 401
  and the login form (never a figure).
- `POST /dashboard/login` (form field `key`): a valid key gets an HttpOnly, SameSite=Strict
  session cookie (Secure over https) and a 303 to /dashboard.
- `POST /dashboard/logout`, `POST /dashboard/rollback` (form fields `checkpoint`, `csrf`): need
  the session cookie *and* the session's CSRF token from the page's form; a Bearer header is not
  enough. Rollback is for admin keys only (403 otherwise) and calls `registry.rollback`.

An org's key sees its own org; an admin key (`etude keys create --admin`) sees every org and the
shared checkpoints. Everything rendered goes through jinja2 with autoescape on; the page sends a
Content-Security-Policy that allows no script at all. POSTs that carry an `Origin` header from
another origin are refused (403).

Sessions are opaque random tokens held in this process's memory (`Sessions`): they end with
the process, after `SESSION_TTL_S`, on logout, or as soon as their key is revoked (the key is
looked up again on every request). Not guaranteed: sessions shared between several server
processes (each has its own), rate limiting of login attempts (keys are 192-bit random); behind a
TLS-terminating proxy the scheme must reach uvicorn (proxy headers), or the Origin check refuses
the POSTs and the cookie is not marked Secure.
What the page shows and what it does not compute: see `etude.serve.dashboard_data`.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from etude.errors import EtudeError, NotFound
from etude.serve import registry
from etude.serve.dashboard_data import ReadoutFn, scope_view, visible_scopes
from etude.store.sql import SQLStore

COOKIE = "etude_dashboard"
SESSION_TTL_S = 12 * 3600
MAX_FORM_BYTES = 8192
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "Cache-Control": "no-store",
    "Referrer-Policy": "same-origin",  # no-referrer would make Chrome send `Origin: null` on our own POSTs
    "X-Content-Type-Options": "nosniff",
}


@dataclass(frozen=True)
class Viewer:
    key_id: str
    org: str
    admin: bool
    csrf: str | None  # None when the request came with a Bearer key (no session)


class Sessions:
    """Opaque random session tokens in memory: token -> (key id, CSRF token, expiry)."""

    def __init__(self, ttl_s: float = SESSION_TTL_S, max_sessions: int = 10_000):
        self.ttl_s, self.max_sessions = ttl_s, max_sessions
        self._by_token: dict[str, tuple[str, str, float]] = {}
        self._lock = threading.Lock()

    def create(self, key_id: str) -> str:
        token, now = secrets.token_urlsafe(32), time.time()
        with self._lock:
            self._by_token = {k: v for k, v in self._by_token.items() if v[2] > now}
            while len(self._by_token) >= self.max_sessions:  # the oldest goes first
                self._by_token.pop(next(iter(self._by_token)))
            self._by_token[token] = (key_id, secrets.token_urlsafe(32), now + self.ttl_s)
        return token

    def get(self, token: str) -> tuple[str, str] | None:
        """(key id, CSRF token) of a live session, or None."""
        with self._lock:
            s = self._by_token.get(token)
        return None if s is None or s[2] <= time.time() else (s[0], s[1])

    def drop(self, token: str) -> None:
        with self._lock:
            self._by_token.pop(token, None)


_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"), autoescape=True)


def _pct(x: Any, signed: bool = False) -> str:
    return "–" if x is None else (f"{x:+.1%}" if signed else f"{x:.1%}")


def _num(x: Any, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}g}"


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


_ENV.filters.update(pct=_pct, num=_num, when=_when)


class _Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def render(status: int, template: str, **ctx: Any) -> HTMLResponse:
    return HTMLResponse(_ENV.get_template(template).render(**ctx), status_code=status, headers=HEADERS)


def add_dashboard(app: FastAPI, store: SQLStore, readout: ReadoutFn | None = None) -> None:
    """Mount the dashboard routes; `app.state.readout` (settable later) computes live readouts."""
    app.state.readout = readout
    sessions = Sessions()

    @app.get("/dashboard")
    async def dashboard(request: Request) -> Response:
        viewer = await _viewer(request, store, sessions, bearer_ok=True)
        if viewer is None:
            return _login(request, 401)
        scopes = await asyncio.to_thread(_page, store, viewer, app.state.readout)
        return render(200, "dashboard.html", viewer=viewer, scopes=scopes, now=time.time())

    @app.post("/dashboard/login")
    async def login(request: Request) -> Response:
        _same_origin(request)
        ident = await asyncio.to_thread(store.identify, (await _form(request)).get("key", "").strip())
        if ident is None:
            return _login(request, 401, "That key is not valid (malformed, unknown or revoked).")
        resp = RedirectResponse("/dashboard", status_code=303, headers=HEADERS)
        resp.set_cookie(COOKIE, sessions.create(ident["id"]), max_age=SESSION_TTL_S, path="/dashboard",
                        httponly=True, samesite="strict", secure=request.url.scheme == "https")
        return resp

    @app.post("/dashboard/logout")
    async def logout(request: Request) -> Response:
        await _session_post(request, store, sessions)
        sessions.drop(request.cookies.get(COOKIE, ""))
        resp = RedirectResponse("/dashboard", status_code=303, headers=HEADERS)
        resp.delete_cookie(COOKIE, path="/dashboard", httponly=True, samesite="strict")
        return resp

    @app.post("/dashboard/rollback")
    async def rollback(request: Request) -> Response:
        viewer, form = await _session_post(request, store, sessions)
        if not viewer.admin:
            raise _Refused(403, "Only an admin key may roll back (etude keys create --admin).")
        name = form.get("checkpoint", "")
        try:
            await asyncio.to_thread(registry.rollback, store, name,
                                    reason=f"dashboard: rolled back by admin key {viewer.key_id}")
        except NotFound:
            raise _Refused(404, f"No checkpoint {name!r}.") from None
        except EtudeError as e:
            raise _Refused(409, str(e)) from None
        return RedirectResponse("/dashboard", status_code=303, headers=HEADERS)

    @app.exception_handler(_Refused)
    async def _refused(request: Request, e: _Refused) -> Response:
        if e.status == 401:
            return _login(request, 401, e.message)
        return render(e.status, "message.html", code=e.status, message=e.message)


def _login(request: Request, status: int, message: str = "") -> HTMLResponse:
    resp = render(status, "login.html", message=message)
    if status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="etude dashboard"'
    return resp


def _page(store: SQLStore, viewer: Viewer, readout: ReadoutFn | None) -> list[dict[str, Any]]:
    return [scope_view(store, org, readout) for org in visible_scopes(store, viewer.org, viewer.admin)]


async def _viewer(request: Request, store: SQLStore, sessions: Sessions, *, bearer_ok: bool) -> Viewer | None:
    """Who is asking: a Bearer key (if `bearer_ok`), else the session cookie; None if neither is valid."""
    auth = request.headers.get("authorization", "")
    if bearer_ok and auth.lower().startswith("bearer "):
        ident = await asyncio.to_thread(store.identify, auth[7:].strip())
        return None if ident is None else Viewer(ident["id"], ident["org_id"], ident["admin"], None)
    token = request.cookies.get(COOKIE, "")
    session = sessions.get(token) if token else None
    if session is None:
        return None
    rec = await asyncio.to_thread(store.key_record, session[0])
    if rec is None:  # the key was revoked since the login
        sessions.drop(token)
        return None
    return Viewer(rec["id"], rec["org_id"], rec["admin"], session[1])


async def _session_post(request: Request, store: SQLStore, sessions: Sessions) -> tuple[Viewer, dict[str, str]]:
    """A state-changing POST: same origin, a live session cookie and that session's CSRF token."""
    _same_origin(request)
    viewer = await _viewer(request, store, sessions, bearer_ok=False)
    if viewer is None or viewer.csrf is None:
        raise _Refused(401, "Sign in first: this action needs the session cookie of the login form.")
    form = await _form(request)
    if not hmac.compare_digest(form.get("csrf", "").encode(), viewer.csrf.encode()):
        raise _Refused(403, "The form's CSRF token does not match this session: reload the page and try again.")
    return viewer, form


def _same_origin(request: Request) -> None:
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.headers.get('host', '')}":
        raise _Refused(403, "Cross-origin form posts are refused.")


async def _form(request: Request) -> dict[str, str]:
    """An application/x-www-form-urlencoded body (at most MAX_FORM_BYTES): first value of each field."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise _Refused(413, f"The form is over {MAX_FORM_BYTES} bytes.")
    fields = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {k: v[0] for k, v in fields.items()}
