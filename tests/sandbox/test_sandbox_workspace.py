"""Copy-on-write workspaces: kinds, diff completeness (git apply round trip), cleanup, crashes."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from etude.errors import EtudeError
from etude.sandbox import Workspace, run
from etude.sandbox.diff import IGNORED_DIRS
from tests.sandbox.crash import crash_leaving_workspace

# overlayfs is mounted by the launcher, which must be root; elsewhere those cases skip (loudly).
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="overlay workspaces need a root launcher")
KINDS = [pytest.param("overlay", marks=needs_root), "worktree", "copy"]


def make_template(root: Path, git: bool = False) -> Path:
    tpl = root / "tpl"
    (tpl / "pkg" / "sub").mkdir(parents=True)
    (tpl / "pkg" / "m.py").write_text("a = 1\nb = 2\nc = 3\n")
    (tpl / "pkg" / "sub" / "deep.txt").write_text("deep\n")
    (tpl / "nonl.txt").write_text("no newline")
    (tpl / "gone.txt").write_text("bye\n")
    (tpl / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (tpl / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (tpl / "dir_to_remove").mkdir()
    (tpl / "dir_to_remove" / "x.txt").write_text("x\n")
    (tpl / "link").symlink_to("pkg/m.py")
    (tpl / "becomes_dir.txt").write_text("file\n")
    (tpl / "becomes_file").mkdir()
    (tpl / "becomes_file" / "inner.txt").write_text("inner\n")
    if git:
        subprocess.run(["git", "init", "-q", str(tpl)], check=True)
        subprocess.run(["git", "-C", str(tpl), "add", "-A"], check=True)
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        }
        subprocess.run(["git", "-C", str(tpl), "commit", "-qm", "init"], check=True, env=env)
    return tpl


EDITS = (
    "printf 'a = 1\\nb = 20\\nc = 3\\n' > pkg/m.py; "
    "printf 'no newline, still' > nonl.txt; "
    "rm gone.txt; rm -r dir_to_remove; mkdir dir_to_remove; echo y > dir_to_remove/y.txt; "
    "printf '\\000\\001binary' >> blob.bin; "
    "chmod +x pkg/sub/deep.txt; "
    "mkdir -p new/dir && echo new > new/dir/file.txt; "
    "echo spaced > 'with space.txt'; "
    ": > empty.txt; "
    "ln -sf run.sh link; "
    "rm becomes_dir.txt; mkdir becomes_dir.txt; echo in > becomes_dir.txt/inner; "
    "rm -r becomes_file; echo now-a-file > becomes_file; "
    "mkdir -p pkg/__pycache__ && echo junk > pkg/__pycache__/m.cpython-311.pyc; "
    "mkdir .pytest_cache && echo junk > .pytest_cache/x; echo junk > stray.pyc"
)


def _same_tree(a: Path, b: Path) -> None:
    cmp = filecmp.dircmp(a, b, ignore=[*IGNORED_DIRS, "stray.pyc"])
    _assert_same(cmp)


def _assert_same(cmp: filecmp.dircmp) -> None:
    assert not cmp.left_only and not cmp.right_only and not cmp.diff_files, (
        cmp.left,
        cmp.left_only,
        cmp.right_only,
        cmp.diff_files,
    )
    for sub in cmp.subdirs.values():
        _assert_same(sub)


@pytest.mark.parametrize("kind", KINDS)
def test_diff_round_trips_through_git_apply(tmp_path: Path, kind: str) -> None:
    tpl = make_template(tmp_path, git=(kind == "worktree"))
    pristine = tmp_path / "pristine"
    shutil.copytree(tpl, pristine, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    with Workspace.create(tpl, kind=kind, root=tmp_path / "wsroot") as ws:
        assert ws.kind == kind
        r = run(["sh", "-c", EDITS], workspace=ws.path)
        assert r.returncode == 0, r.stderr
        patch = ws.diff()
        target = tmp_path / "target"
        shutil.copytree(pristine, target, symlinks=True)
        subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], input=patch.encode(), cwd=target, check=True)
        _same_tree(target, ws.path)
    assert "__pycache__" not in patch and ".pytest_cache" not in patch and ".pyc" not in patch
    assert "deleted file mode 100644" in patch and "new file mode" in patch and "GIT binary patch" in patch
    assert "old mode 100644\nnew mode 100755" in patch
    _same_tree(tpl, pristine)  # the template was not touched


def test_unchanged_workspace_has_empty_diff(tmp_path: Path) -> None:
    tpl = make_template(tmp_path)
    with Workspace.create(tpl, root=tmp_path / "wsroot") as ws:
        assert ws.diff() == ""
        (ws.path / "pkg" / "m.py").write_text("a = 1\nb = 2\nc = 3\n")  # rewritten, same bytes
        assert ws.diff() == ""


@needs_root
def test_overlay_creation_is_a_mount_and_close_removes_it(tmp_path: Path) -> None:
    tpl = make_template(tmp_path)
    ws = Workspace.create(tpl, kind="overlay", root=tmp_path / "wsroot")
    assert ws.path.is_mount()
    assert (ws.path / "pkg" / "m.py").read_text().startswith("a = 1")
    ws.close()
    ws.close()  # idempotent
    assert not ws.base.exists()
    assert str(ws.path) not in Path("/proc/self/mountinfo").read_text()


@needs_root
def test_many_overlays_at_once(tmp_path: Path) -> None:
    tpl = make_template(tmp_path)
    spaces: list[Workspace] = []
    lock = threading.Lock()

    def make(i: int) -> None:
        w = Workspace.create(tpl, root=tmp_path / "wsroot")
        (w.path / f"only{i}.txt").write_text(f"{i}\n")
        with lock:
            spaces.append(w)

    threads = [threading.Thread(target=make, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len({w.path for w in spaces}) == 12
        for w in spaces:
            names = [p.name for p in w.path.glob("only*.txt")]
            assert len(names) == 1 and f"b/{names[0]}" in w.diff()
    finally:
        for w in spaces:
            w.close()
    assert not list((tmp_path / "wsroot").glob("ws-*"))


@needs_root
def test_workspace_left_by_a_crashed_process_is_swept(tmp_path: Path) -> None:
    tpl, root = make_template(tmp_path), tmp_path / "wsroot"
    base, merged = crash_leaving_workspace(tpl, root)
    assert base.exists() and merged.is_mount() and (base / "disk").is_mount()  # the crash left both mounts behind
    with Workspace.create(tpl, root=root) as fresh:
        assert not base.exists() and not merged.is_mount()
        assert str(base) not in Path("/proc/self/mountinfo").read_text()
        assert fresh.path.exists()


def test_auto_falls_back_to_copy_without_overlay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import etude.sandbox.workspace as wsmod

    def no_mount(*a: object) -> None:
        raise OSError(1, "overlay not permitted here")

    monkeypatch.setattr(wsmod, "_mount_overlay", no_mount)
    tpl = make_template(tmp_path)  # not a git checkout: worktree is impossible too
    with Workspace.create(tpl, root=tmp_path / "wsroot") as ws:
        assert ws.kind == "copy"
        (ws.path / "gone.txt").unlink()
        assert "deleted file mode 100644" in ws.diff()


def test_bad_template_is_an_etude_error(tmp_path: Path) -> None:
    with pytest.raises(EtudeError):
        Workspace.create(tmp_path / "missing")
    with pytest.raises(EtudeError):
        Workspace.create(tmp_path, kind="zfs")  # type: ignore[arg-type]
    with pytest.raises(EtudeError):
        Workspace.create(make_template(tmp_path), kind="worktree")  # not a git checkout


def test_worktrees_of_one_template_at_once(tmp_path: Path) -> None:
    tpl = make_template(tmp_path, git=True)
    spaces: list[Workspace] = []
    errors: list[BaseException] = []

    def make() -> None:
        try:
            spaces.append(Workspace.create(tpl, kind="worktree", root=tmp_path / "wsroot"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in spaces:
        w.close()
    assert errors == [] and len(spaces) == 4
    listed = subprocess.run(["git", "-C", str(tpl), "worktree", "list"], capture_output=True, text=True).stdout
    assert len(listed.strip().splitlines()) == 1  # only the template itself is left


def test_unusual_file_names_round_trip(tmp_path: Path) -> None:
    tpl = tmp_path / "tpl"
    tpl.mkdir()
    (tpl / 'old "quoted".txt').write_text("q\n")
    names = ['new "quoted".txt', "tab\there.txt", "ünïcode.txt", "back\\slash.txt", "-dash.txt"]
    with Workspace.create(tpl, root=tmp_path / "wsroot") as ws:
        for n in names:
            (ws.path / n).write_text(f"{n}\n")
        (ws.path / 'old "quoted".txt').write_text("changed\n")
        patch = ws.diff()
    subprocess.run(["git", "apply", "-"], input=patch.encode(), cwd=tpl, check=True)
    for n in names:
        assert (tpl / n).read_text() == f"{n}\n"
    assert (tpl / 'old "quoted".txt').read_text() == "changed\n"


# -- disk quota ---------------------------------------------------------------------------------
FILL = """
import errno, os
written, err = 0, None
try:
    for i in range(64):
        with open(f"fill{i}.bin", "wb") as fh:  # many files: the per-file rlimit is not what stops this
            for _ in range(4):
                fh.write(b"x" * 262144)
                fh.flush()
                os.fsync(fh.fileno())
                written += 262144
except OSError as e:
    err = errno.errorcode.get(e.errno)
print(written, err)
"""


@needs_root
@pytest.mark.parametrize("kind", KINDS)
def test_a_workspace_that_writes_past_its_quota_gets_enospc_and_the_host_keeps_its_space(
    tmp_path: Path, kind: str, cfg
) -> None:
    tpl = make_template(tmp_path, git=kind == "worktree")
    with Workspace.create(tpl, kind=kind, root=tmp_path / "wsroot", disk_mb=8) as ws:  # type: ignore[arg-type]
        assert ws.kind == kind and ws.disk_mb == 8
        res = run(["python3", "-c", FILL], workspace=ws.path, config=cfg)
        written, err = res.stdout.split()
        assert res.returncode == 0 and err == "ENOSPC", res.stdout + res.stderr  # the agent sees ENOSPC ...
        assert 4 * 2**20 < int(written) <= 8 * 2**20  # ... at the cap, not before and not after
        st = os.statvfs(ws.path)
        assert 7 * 2**20 < st.f_blocks * st.f_frsize <= 8 * 2**20  # the writable layer is its own filesystem,
        assert (ws.base / "disk.img").stat().st_size == 8 * 2**20  # an 8 MiB image file on the root's disk,
        assert os.stat(ws.path / "fill0.bin").st_dev != os.stat(tmp_path).st_dev  # not the host's filesystem
        # the workspace still works at the cap: a removal frees space, and the diff holds the files
        (ws.path / "fill0.bin").unlink()
        (ws.path / "after.txt").write_text("room again\n")
        assert "b/after.txt" in ws.diff() and "b/fill1.bin" in ws.diff()
        base = ws.base
    assert not base.exists() and str(base) not in Path("/proc/self/mountinfo").read_text()


@needs_root
def test_the_default_quota_is_1_gib_and_none_means_no_cap(tmp_path: Path) -> None:
    from etude.sandbox import SandboxConfig

    tpl = make_template(tmp_path)
    assert SandboxConfig().workspace_disk_mb == 1024
    with Workspace.create(tpl, root=tmp_path / "wsroot") as ws:
        st = os.statvfs(ws.path)
        assert ws.disk_mb == 1024 and (ws.base / "disk.img").stat().st_size == 1024 * 2**20
        assert 0.95 * 2**30 < st.f_blocks * st.f_frsize <= 2**30  # ext4's own metadata takes the rest
    with Workspace.create(tpl, kind="copy", root=tmp_path / "wsroot", disk_mb=None) as ws:
        assert ws.disk_mb is None and not (ws.base / "disk").is_mount()
        assert os.stat(ws.path).st_dev == os.stat(tmp_path).st_dev


@needs_root
def test_a_template_larger_than_the_quota_is_one_clear_error(tmp_path: Path) -> None:
    tpl = make_template(tmp_path)
    (tpl / "big.bin").write_bytes(b"\0" * (3 * 2**20))
    with pytest.raises(EtudeError, match="larger than the workspace's disk cap of 2 MiB"):
        Workspace.create(tpl, kind="copy", root=tmp_path / "wsroot", disk_mb=2)
    assert not list((tmp_path / "wsroot").glob("ws-*"))
    with Workspace.create(tpl, kind="overlay", root=tmp_path / "wsroot", disk_mb=2) as ws:
        assert (ws.path / "big.bin").stat().st_size == 3 * 2**20  # an overlay's lower layer costs no quota


def test_bad_disk_quota_is_an_etude_error(tmp_path: Path) -> None:
    tpl = make_template(tmp_path)
    for bad in (0, -1, 1.5, "1G", True):
        with pytest.raises(EtudeError, match="disk_mb"):
            Workspace.create(tpl, kind="copy", root=tmp_path / "wsroot", disk_mb=bad)  # type: ignore[arg-type]
