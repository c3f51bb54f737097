"""`etude eval` end to end on real isodate tasks: real sandbox, real harness, real grading.

The oracle (gold patch written through the tools) must resolve every task with the maximum
adherence, noop must resolve none, a run killed with SIGKILL midway must resume without
rerunning the episodes it finished, compare(oracle, noop) must fail the gate, and the HTML
report must load in a real headless Chromium with its summary table.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from etude.errors import EtudeError
from etude.evals import CompareConfig, EvalConfig, compare, run_eval

pytestmark = pytest.mark.slow
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def suite(isodate_tasks, tmp_path_factory):
    from etude.tasks import save_tasks

    assert len(isodate_tasks) >= 2
    path = tmp_path_factory.mktemp("suite") / "isodate.jsonl"
    save_tasks(isodate_tasks[:3], path)
    return path


@pytest.fixture(scope="module")
def oracle_run(suite, tmp_path_factory):
    out = tmp_path_factory.mktemp("oracle")
    return out, run_eval(suite, "oracle", out, EvalConfig(workers=2, executor="threads", progress=False), use="final")


@pytest.fixture(scope="module")
def noop_run(suite, tmp_path_factory):
    out = tmp_path_factory.mktemp("noop")
    cfg = EvalConfig(workers=2, executor="threads", progress=False, report=False)
    return out, run_eval(suite, "noop", out, cfg, use="final")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def test_oracle_resolves_everything_with_maximum_adherence(oracle_run, suite):
    out, s = oracle_run
    n = len(_lines(suite))
    assert s["correctness"]["resolved_rate"]["mean"] == 1.0, [
        r["outcome"] for r in map(json.loads, _lines(out / "results.jsonl"))
    ]
    assert s["correctness"]["pass_at_k"]["1"]["mean"] == 1.0
    from etude.evals.stats import wilson_ci

    # every task at 1.0: a 0/1 proportion, so a Wilson interval (never zero-width)
    assert s["adherence"]["score"] == {"mean": 1.0, "ci_low": wilson_ci(n, n)[0], "ci_high": 1.0, "n": n}
    assert s["errors"] == 0 and s["flags"] == {}
    recs = [json.loads(x) for x in _lines(out / "results.jsonl")]
    assert len(recs) == n and all(r["diff"] for r in recs)
    eff = recs[0]["efficiency"]
    assert eff["tool_calls"] >= 1 and eff["turns"] == 2 and eff["broken_calls"] == 0 and eff["tokens"] > 0
    assert all((out / r["trajectory"]).is_file() for r in recs)
    assert json.loads((out / "summary.json").read_text())["correctness"] == s["correctness"]


def test_noop_resolves_nothing(noop_run):
    out, s = noop_run
    assert s["correctness"]["resolved_rate"]["mean"] == 0.0
    assert s["correctness"]["partial_rate"]["mean"] == 0.0
    assert s["adherence"]["score"]["mean"] is None  # nothing to judge in an empty patch
    recs = [json.loads(x) for x in _lines(out / "results.jsonl")]
    assert all(r["status"] == "ok" and r["diff"] == "" and r["efficiency"]["tool_calls"] == 0 for r in recs)


def test_compare_oracle_to_noop_fails_the_gate(oracle_run, noop_run):
    with pytest.raises(EtudeError, match="at least 30 tasks"):
        compare(oracle_run[0], noop_run[0])  # the default gate refuses a 3-task suite
    small = CompareConfig(min_tasks=3)
    v = compare(oracle_run[0], noop_run[0], small)
    r = v["metrics"]["resolved"]
    assert r["delta"] == -1.0 and v["gate_passed"] is False and v["gate"] in ("failed", "inconclusive")
    same = compare(oracle_run[0], oracle_run[0], small)
    assert same["gate"] == "inconclusive" and same["gate_passed"] is False  # 3 tasks cannot exclude harm


def _chromium_dom(html: Path, profile: Path) -> str:
    argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
            "--dump-dom", html.as_uri()]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.skipif(not CHROMIUM.is_file(), reason="needs Debian chromium at /usr/bin/chromium")
def test_report_loads_in_headless_chromium(oracle_run, tmp_path):
    out, s = oracle_run
    report = Path(s["report"])
    dom = _chromium_dom(report, tmp_path / "profile")
    start = dom.index('<table id="summary">')
    table = dom[start : dom.index("</table>", start)]
    assert "resolved rate" in table and "100.0%" in table and "adherence score" in table
    assert dom.count('class="task"') == s["tasks"]  # one section per task
    assert "agent diff" in dom and "gold diff" in dom and "reward term" in dom
    for png in ("plots/correctness_vs_tokens.png", "plots/metrics.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_killed_run_resumes_without_rerunning_finished_episodes(suite, tmp_path):
    # Each episode sleeps 2 s in the sandbox, so the run is killed while one is in flight. It also
    # plants a conftest.py: the hack flag must reach the records and the summary.
    cmd = "sleep 2; echo 'collect_ignore = []' > tests/conftest.py"
    script = tmp_path / "slow.json"
    script.write_text(json.dumps([{"tool_calls": [{"name": "run_terminal", "arguments": {"command": cmd}}]}]))
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "etude.cli", "eval", "--suite", str(suite), "--model", f"scripted:{script}",
            "--out", str(out), "--workers", "1", "--executor", "threads", "--no-report"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not _lines(out / "results.jsonl") and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    first = _lines(out / "results.jsonl")
    n = len(_lines(suite))
    assert 1 <= len(first) < n, "the run should have been killed midway"

    cfg = EvalConfig(workers=1, executor="threads", progress=False, report=False)
    s = run_eval(suite, f"scripted:{script}", out, cfg, use="final")
    after = _lines(out / "results.jsonl")
    assert after[: len(first)] == first  # finished records untouched
    recs = [json.loads(x) for x in after]
    assert len(recs) == n and len({r["instance_id"] for r in recs}) == n  # nothing ran twice
    assert {r["pid"] for r in recs[: len(first)]} == {proc.pid}
    assert all(r["pid"] == os.getpid() for r in recs[len(first) :])
    assert s["resumed_skipped"] == len(first) and s["episodes"] == n
    assert s["flags"] == {"conftest_edit": n} and all(r["flags"][0]["voids"] for r in recs)


def _completion(content, calls=None):
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                             for i, (n, a) in enumerate(calls)]  # fmt: skip
    return {"id": "r", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}  # fmt: skip


@pytest.fixture
def chat_server():
    """A real HTTP server on loopback speaking the chat-completions API, replaying two replies:
    two parallel reads plus one call with broken JSON, then a clarification question."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    replies = [
        _completion(
            "Looking.",
            [("list_dir", '{"path": "."}'), ("read_file", '{"path": "README.rst"}'), ("grep", '{"pattern": ')],
        ),  # fmt: skip
        _completion("Could you clarify which behaviour you expect?"),
    ]
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps(replies[min(len(seen), len(replies)) - 1]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1", seen
    server.shutdown()


def test_openai_server_model_and_efficiency_counts(suite, tmp_path, chat_server):
    url, seen = chat_server
    cfg = EvalConfig(max_tasks=1, workers=1, executor="threads", progress=False, report=False)
    s = run_eval(suite, f"{url}#test-model", tmp_path / "run", cfg, use="final")
    (rec,) = [json.loads(x) for x in _lines(tmp_path / "run" / "results.jsonl")]
    eff = rec["efficiency"]
    assert seen[0]["model"] == "test-model" and {t["function"]["name"] for t in seen[0]["tools"]} >= {
        "read_file",
        "grep",
    }
    assert (eff["turns"], eff["tool_calls"], eff["parallel_calls"]) == (2, 2, 2)
    assert eff["broken_calls"] == 1 and eff["clarifications"] == 1
    assert (eff["prompt_tokens"], eff["completion_tokens"], eff["token_counts"]) == (200, 20, "usage")
    assert rec["resolved"] is False and rec["reward"]["terms"]["needless_clarification"] == -1.0
    assert s["efficiency"]["broken_calls"]["total"] == 1
