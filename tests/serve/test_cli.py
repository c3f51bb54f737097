"""`etude keys / registry / experiment / distill` through the real CLI app (in-process runner)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from etude.cli import app
from etude.store import open_store


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_keys_registry_experiment_and_distill_commands(tmp_path):
    db = f"sqlite:///{tmp_path / 'c.db'}"
    r = _run("keys", "create", "--org", "acme", "--db", db)
    assert r.exit_code == 0, r.output
    key = r.output.strip()
    assert key.startswith("etk_") and open_store(db).authenticate(key) == "acme"
    listed = json.loads(_run("keys", "list", "--org", "acme", "--db", db).output)
    assert [k["id"] for k in listed] == [key.split("_")[1]]

    assert _run("registry", "add", "v1", "--path", "tiny", "--state", "production", "--db", db).exit_code == 0
    assert _run("registry", "add", "v2", "--path", "tiny", "--version", "1", "--db", db).exit_code == 0
    r = _run("experiment", "set", "canary", "--arm", "control=v1:0.9", "--arm", "canary=v2:0.1", "--db", db)
    assert r.exit_code == 0, r.output
    assert [a["weight"] for a in json.loads(r.output)["arms"]] == [0.9, 0.1]
    states = {c["name"]: c["state"] for c in json.loads(_run("registry", "list", "--db", db).output)}
    assert states == {"v1": "production", "v2": "canary"}
    assert json.loads(_run("registry", "promote", "v2", "--db", db).output)["state"] == "production"
    assert json.loads(_run("registry", "rollback", "--db", db).output)["production"]["name"] == "v1"

    out = tmp_path / "d.jsonl"
    r = _run("distill", "--org", "acme", "--out", str(out), "--db", db)
    assert r.exit_code == 0 and json.loads(r.output)["samples"] == 0 and out.read_text() == ""


def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    import pytest

    from etude.cli import main

    db = f"sqlite:///{tmp_path / 'c.db'}"
    for args in (("keys", "create", "--org", "bad org", "--db", db),
                 ("experiment", "set", "e", "--arm", "nonsense", "--db", db),
                 ("registry", "promote", "missing", "--db", db),
                 ("keys", "list", "--org", "acme", "--db", "nope://")):
        monkeypatch.setattr("sys.argv", ["etude", *args])
        with pytest.raises(SystemExit) as exc:
            main()
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("etude: error: ") and "\n" not in err and "Traceback" not in err
