"""The contract in docs/contracts.md: run / make_sandbox / Workspace, with real bwrap."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from etude.errors import EtudeError
from etude.protocols import Sandbox
from etude.sandbox import SandboxConfig, Workspace, make_sandbox, run


def test_run_status_output_and_writes_land_in_workspace(ws: Path, cfg: SandboxConfig) -> None:
    r = run(["sh", "-c", "echo out; echo err >&2; pwd > where; exit 7"], workspace=ws, config=cfg)
    assert (r.returncode, r.stdout, r.stderr, r.timed_out) == (7, "out\n", "err\n", False)
    assert (ws / "where").read_text() == "/workspace\n"


def test_identity_and_clean_environment(ws: Path) -> None:
    cfg = SandboxConfig(env={"FOO": "bar"})
    r = run(["sh", "-c", "id -u; id -g; env | sort"], workspace=ws, config=cfg)
    lines = r.stdout.splitlines()
    assert lines[:2] == ["1000", "1000"]
    names = {ln.split("=", 1)[0] for ln in lines[2:]}
    assert "FOO=bar" in lines
    assert names <= {"PATH", "HOME", "LANG", "TMPDIR", "USER", "FOO", "PWD", "SHLVL", "_"}


def test_venv_python_works_inside(ws: Path, cfg: SandboxConfig) -> None:
    (ws / "test_x.py").write_text("def test_ok():\n    assert 1 + 1 == 2\n")
    r = run(["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"], workspace=ws, config=cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed" in r.stdout


def test_stdin_is_fed(ws: Path) -> None:
    r = run(["sh", "-c", "wc -c"], workspace=ws, stdin="x" * 200_000)
    assert r.stdout.strip() == "200000"


def test_make_sandbox_is_a_protocol_sandbox(ws: Path, cfg: SandboxConfig) -> None:
    sb = make_sandbox(ws, cfg)
    assert isinstance(sb, Sandbox)
    assert sb.exec(["sh", "-c", "echo hi"], timeout_s=5).stdout == "hi\n"


def test_bad_input_is_an_etude_error(tmp_path: Path) -> None:
    with pytest.raises(EtudeError):
        run(["true"], workspace=tmp_path / "missing")
    with pytest.raises(EtudeError):
        run([], workspace=tmp_path)
    with pytest.raises(EtudeError):
        make_sandbox(tmp_path, SandboxConfig(ro_binds=("/no/such/path",)))
    with pytest.raises(EtudeError):
        make_sandbox(tmp_path, SandboxConfig(backend="docker"))  # type: ignore[arg-type]
    with pytest.raises(EtudeError, match="memory_mb"):
        run(["true"], workspace=tmp_path, config=SandboxConfig(memory_mb=-5))
    with pytest.raises(EtudeError, match="environment"):
        make_sandbox(tmp_path, SandboxConfig(env={"A=B": "x"}))


@pytest.mark.parametrize(
    "kind",
    [pytest.param("overlay", marks=pytest.mark.skipif(os.geteuid() != 0, reason="overlay needs root")), "copy"],
)
def test_workspace_diff_applies_to_template(tmp_path: Path, kind: str) -> None:
    tpl = tmp_path / "tpl"
    (tpl / "pkg").mkdir(parents=True)
    (tpl / "pkg" / "m.py").write_text("a = 1\n")
    (tpl / "old.txt").write_text("old\n")
    with Workspace.create(tpl, kind=kind) as w:
        assert w.kind == kind
        r = run(["sh", "-c", "echo 'a = 2' > pkg/m.py; rm old.txt; echo n > new.txt"], workspace=w.path)
        assert r.returncode == 0, r.stderr
        patch = w.diff()
        base = w.base
    assert not base.exists()
    assert (tpl / "old.txt").read_text() == "old\n" and not (tpl / "new.txt").exists()
    subprocess.run(["git", "apply", "-"], input=patch.encode(), cwd=tpl, check=True)
    assert (tpl / "pkg" / "m.py").read_text() == "a = 2\n"
    assert not (tpl / "old.txt").exists() and (tpl / "new.txt").read_text() == "n\n"
