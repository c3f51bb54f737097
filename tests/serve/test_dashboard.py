"""/dashboard on the real server (uvicorn on loopback, a real SQLite store, keys made by the
store): no key no data, org isolation, admin keys, Bearer and cookie sign-in, a CSRF-safe
admin-only rollback, the loop's live readout, and one headless-Chromium check of the page."""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from typer.testing import CliRunner

from etude.cli import app as cli_app
from etude.loop.config import CanarySection, LoopConfig, TrafficConfig
from etude.loop.readout import dashboard_readout
from etude.serve import registry
from etude.store import open_store
from etude.store.engine import MIGRATIONS, make_engine
from etude.store.sql import hash_key
from tests.serve.conftest import free_port, start_server

CHROMIUM = Path("/usr/bin/chromium")
ORGS = ("acme", "globex")


@dataclass
class Dash:
    base: str  # http://127.0.0.1:PORT
    store: Any
    app: Any
    keys: dict[str, str]

    def get(self, who: str | None = None, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.keys[who]}"} if who else {}
        return httpx.get(f"{self.base}/dashboard", headers=headers, timeout=30, **kw)

    def login(self, who: str) -> httpx.Client:
        client = httpx.Client(base_url=self.base, timeout=30)
        r = client.post("/dashboard/login", data={"key": self.keys[who]})
        assert r.status_code == 303 and r.headers["location"] == "/dashboard", r.text
        return client


@pytest.fixture
def dash(tmp_path: Path) -> Any:
    running, srv, th = start_server(tmp_path)
    store = running.store
    for org in ORGS:
        registry.register_checkpoint(store, f"{org}-prod", "fake", org=org, state="production")
        registry.register_checkpoint(store, f"{org}-cand", "fake", org=org)
        registry.set_experiment(store, f"{org}-canary", [("control", f"{org}-prod", 0.8),
                                                         ("canary", f"{org}-cand", 0.2)], org=org, salt="s")
    keys = {org: store.create_key(org) for org in ORGS} | {"admin": store.create_key("ops", admin=True)}
    yield Dash(running.base_url.removesuffix("/v1"), store, srv.config.app, keys)
    srv.should_exit = True
    th.join(timeout=10)


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF token in the page"
    return m.group(1)


def test_no_key_no_data(dash: Dash) -> None:
    bad = {"Authorization": "Bearer etk_0123456789_notavalidkeynotavalidkey"}
    for r in (dash.get(), httpx.get(f"{dash.base}/dashboard", headers=bad),
              httpx.get(f"{dash.base}/dashboard", cookies={"etude_dashboard": "forged"}),
              httpx.post(f"{dash.base}/dashboard/login", data={"key": "etk_nope"})):
        assert r.status_code == 401 and 'action="/dashboard/login"' in r.text
        assert not any(s in r.text for s in ("acme", "globex", "canary", "Organisation ", "fake", "%")), r.text


def test_an_org_key_sees_its_own_org_only_and_another_orgs_promotion_leaves_it_untouched(dash: Dash) -> None:
    for org, other in (ORGS, ORGS[::-1]):
        html = dash.get(org).text
        assert f"Organisation {org}" in html and f"{org}-prod" in html and f"{org}-cand" in html
        assert f"{org}-canary" in html and "80.0%" in html and "20.0%" in html
        assert other not in html and "Shared checkpoints" not in html and "Roll back" not in html
    before = dash.get("acme").text
    registry.promote(dash.store, "globex-cand", "loop cycle 1: accept_rate +12% [3%, 21%]")
    globex = dash.get("globex").text
    assert "loop cycle 1: accept_rate +12% [3%, 21%]" in globex and "promote" in globex
    assert "replaced by globex-cand" in globex and "No active experiment" in globex
    after = dash.get("acme").text
    strip = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ")  # the page's clock
    assert strip.sub("", after) == strip.sub("", before)


def test_an_admin_key_sees_every_org_and_the_shared_scope(dash: Dash) -> None:
    html = dash.get("admin").text
    for org in ORGS:
        assert f"Organisation {org}" in html and f"{org}-prod" in html and f"{org}-canary" in html
    assert "Organisation ops" in html and "Shared checkpoints" in html
    assert "sign in through the form to roll back" in html and 'action="/dashboard/rollback"' not in html


def test_cookie_sign_in_is_httponly_strict_and_ends_with_logout_or_revocation(dash: Dash) -> None:
    client = dash.login("acme")
    cookie = client.post("/dashboard/login", data={"key": dash.keys["acme"]}).headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/dashboard" in cookie
    page = client.get("/dashboard")
    assert page.status_code == 200 and "acme-prod" in page.text and "globex" not in page.text
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'none': no script
    assert client.post("/dashboard/logout", data={"csrf": _csrf(page.text)}).status_code == 303
    assert client.get("/dashboard").status_code == 401
    admin = dash.login("admin")
    dash.store.revoke_key("ops", dash.keys["admin"].split("_")[1])
    assert admin.get("/dashboard").status_code == 401  # a revoked key's session ends at once


def test_only_an_admin_with_session_and_csrf_token_can_roll_back(dash: Dash) -> None:
    org = dash.login("acme")
    token = _csrf(org.get("/dashboard").text)
    assert org.post("/dashboard/rollback", data={"checkpoint": "acme-cand", "csrf": token}).status_code == 403
    bearer = {"Authorization": f"Bearer {dash.keys['admin']}"}
    assert httpx.post(f"{dash.base}/dashboard/rollback", headers=bearer,
                      data={"checkpoint": "acme-cand", "csrf": "x"}).status_code == 401
    admin = dash.login("admin")
    page = admin.get("/dashboard").text
    assert page.count('action="/dashboard/rollback"') == 5  # each org's production and candidate, shared "fake"
    assert admin.post("/dashboard/rollback", data={"checkpoint": "acme-cand", "csrf": "wrong"}).status_code == 403
    cross = admin.post("/dashboard/rollback", data={"checkpoint": "acme-cand", "csrf": _csrf(page)},
                       headers={"Origin": "https://evil.example"})
    assert cross.status_code == 403
    assert registry.get_checkpoint(dash.store, "acme-cand").state == "canary"  # nothing changed so far
    r = admin.post("/dashboard/rollback", data={"checkpoint": "acme-cand", "csrf": _csrf(page)})
    assert r.status_code == 303
    assert registry.get_checkpoint(dash.store, "acme-cand").state == "retired"
    assert registry.active_experiment(dash.store, "acme") is None
    assert registry.get_checkpoint(dash.store, "globex-cand").state == "canary"  # the other org untouched
    assert "dashboard: rolled back by admin key" in admin.get("/dashboard").text
    again = admin.post("/dashboard/rollback", data={"checkpoint": "acme-cand", "csrf": _csrf(page)})
    assert again.status_code == 409 and "already retired" in again.text


def test_the_live_readout_comes_from_the_loops_metrics(dash: Dash) -> None:
    registry.set_experiment(dash.store, "acme-canary", [("control", "acme-prod", 0.5), ("canary", "acme-cand", 0.5)],
                            org="acme", salt="s")
    _traffic(dash, "acme", users=16)
    html = dash.get("acme").text
    assert "no readout recorded for this experiment" in html and "Sample ratio mismatch p" in html
    cfg = LoopConfig(traffic=TrafficConfig(kind="none"), canary=CanarySection(mde=0.2, user_cv=1.0))
    dash.app.state.readout = dashboard_readout(cfg)
    html = dash.get("acme").text
    plan = cfg.canary.plan()
    assert f"planned {plan.users_per_arm[0]} / {plan.users_per_arm[1]} users per arm" in html
    assert "accept_rate (primary)" in html and "always-valid interval" in html and "95% interval" in html
    assert re.search(r"\[[+-]\d+\.\d%, [+-]\d+\.\d%\]", html)  # an interval was rendered
    assert "Hack alarms" in html and "tool_error_rate" in html and "globex" not in html


def test_keys_create_admin_and_a_database_from_before_the_flag_migrates(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'old.db'}"
    engine, cfg = make_engine(db), Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    old_key = "etk_0123456789_" + "k" * 32
    with engine.connect() as conn:  # a store as it was before api_keys.admin, with a key in it
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
        conn.execute(sa.text("INSERT INTO orgs VALUES ('acme', 0)"))
        conn.execute(sa.text("INSERT INTO api_keys (id, org_id, key_hash, name, created_at) "
                             "VALUES ('0123456789', 'acme', :h, '', 0)"), {"h": hash_key(old_key)})
        conn.commit()
    engine.dispose()
    r = CliRunner().invoke(cli_app, ["keys", "create", "--org", "ops", "--admin", "--db", db])
    assert r.exit_code == 0, r.output
    store = open_store(db)
    assert store.identify(old_key) == {"id": "0123456789", "org_id": "acme", "admin": False}
    assert store.identify(r.output.strip())["admin"] is True and store.authenticate(r.output.strip()) == "ops"
    assert [k["admin"] for k in store.list_keys("ops")] == [True]


def _traffic(dash: Dash, org: str, users: int) -> None:
    v1 = f"{dash.base}/v1"
    headers = {"Authorization": f"Bearer {dash.keys[org]}"}
    for u in range(users):
        r = httpx.post(f"{v1}/chat/completions", headers=headers, timeout=30,
                       json={"model": "auto", "user": f"user-{u}", "messages": [{"role": "user", "content": "fix it"}]})
        assert r.status_code == 200, r.text
        kind = "accept" if u % 3 else "reject"
        assert httpx.post(f"{v1}/feedback", headers=headers, timeout=30,
                          json={"interaction_id": r.json()["id"], "kind": kind}).status_code == 200


class _CDP:
    """The Chrome DevTools Protocol over one page's websocket, request by request."""

    def __init__(self, ws: Any):
        self.ws, self.n = ws, 0

    def __call__(self, method: str, **params: Any) -> dict[str, Any]:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.n:
                assert "error" not in msg, msg["error"]
                return msg.get("result", {})

    def eval(self, expr: str) -> Any:
        return self("Runtime.evaluate", expression=expr, returnByValue=True).get("result", {}).get("value")

    def wait_for(self, expr: str, timeout_s: float = 60) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if value := self.eval(expr):
                    return value
            except AssertionError:  # the page navigated mid-evaluation
                pass
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {expr}: {self.eval('location.href + document.body.innerText')}")


def _devtools_page(port: int, proc: subprocess.Popen) -> str:
    for _ in range(600):
        assert proc.poll() is None, "chromium exited"
        try:
            pages = [p for p in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=2).json() if p["type"] == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("chromium's DevTools endpoint did not come up")


@pytest.mark.skipif(not CHROMIUM.is_file(), reason="needs Debian chromium at /usr/bin/chromium")
def test_a_person_signs_in_with_the_form_in_headless_chromium_and_sees_their_org(dash: Dash, tmp_path: Path) -> None:
    sync_client = pytest.importorskip("websockets.sync.client")
    port = free_port()
    argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
            f"--remote-debugging-port={port}", "about:blank"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with sync_client.connect(_devtools_page(port, proc), max_size=None, open_timeout=60) as ws:
            cdp = _CDP(ws)
            cdp("Page.navigate", url=f"{dash.base}/dashboard")
            cdp.wait_for("document.readyState === 'complete' && !!document.getElementById('login')")
            cdp.eval(f"document.getElementById('key').value = {json.dumps(dash.keys['acme'])};"
                     "document.querySelector('#login button').click()")
            text = cdp.wait_for("document.readyState === 'complete' && document.querySelector('section.scope')"
                                " && document.body.innerText")
            cookies = cdp("Network.getCookies", urls=[f"{dash.base}/dashboard"])["cookies"]
            script_cookies = cdp.eval("document.cookie")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "Organisation acme" in text and "acme-prod" in text and "globex" not in text
    arms = re.findall(r"(control|canary)\tacme-(?:prod|cand)\t[\d.]+\t(\d+\.\d%)", text)
    assert arms == [("control", "80.0%"), ("canary", "20.0%")], text
    assert [(c["name"], c["httpOnly"], c["sameSite"]) for c in cookies] == [("etude_dashboard", True, "Strict")]
    assert script_cookies == ""  # HttpOnly: the page's own scripts could not read the session
