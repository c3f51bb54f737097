"""The workspace disk cap is disk, not memory, and fails closed.

A workspace's writable layer is an ext4 image file on the workspace root's disk, loop-mounted
(etude/sandbox/workspace.py). Filling it past its cap must give ENOSPC, cost the host's disk at
most about the cap, and cost no memory beyond page cache; where the cap cannot be set up,
`Workspace.create` must refuse unless running uncapped was asked for.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

import etude.sandbox.workspace as wsmod
from etude.errors import EtudeError
from etude.sandbox import Workspace, run
from tests.sandbox.crash import crash_leaving_workspace

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="loop-mounting the disk image needs a root launcher")
MiB = 2**20

# Writes up to `want` bytes in 1 MiB chunks over many files (the per-file rlimit is not what stops
# it), fsync after each, until an error; prints the bytes written and the error's name.
FILL = """
import errno, os, sys
want, written, err = int(sys.argv[1]), 0, None
try:
    i = 0
    while written < want:
        with open(f"fill{i}.bin", "wb") as fh:
            for _ in range(16):
                fh.write(b"x" * 1048576)
                fh.flush()
                os.fsync(fh.fileno())
                written += 1048576
        i += 1
except OSError as e:
    err = errno.errorcode.get(e.errno)
print(written, err)
"""


def _meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        out[key] = int(value.split()[0]) * 1024
    return out


def _loops_backed_by(root: Path) -> list[str]:
    found = []
    for f in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if f.read_text().strip().startswith(str(root)):
                found.append(f.parent.parent.name)
        except OSError:
            continue
    return found


def _template(tmp_path: Path) -> Path:
    tpl = tmp_path / "tpl"
    (tpl / "pkg").mkdir(parents=True)
    (tpl / "pkg" / "m.py").write_text("a = 1\n")
    return tpl


@needs_root
@pytest.mark.parametrize("kind", ["overlay", "copy"])
def test_filling_a_workspace_past_its_cap_is_enospc_on_disk_not_memory(tmp_path: Path, kind: str, cfg) -> None:
    cap, attempt = 256, 1024  # MiB: try to write 4x the cap
    root = tmp_path / "wsroot"
    tpl = _template(tmp_path)
    with Workspace.create(tpl, kind=kind, root=root, disk_mb=cap) as ws:  # type: ignore[arg-type]
        assert ws.disk_mb == cap and wsmod._memory_fs(ws.base) is None  # the image is on a disk filesystem
        image = ws.base / "disk.img"
        allocated0 = image.stat().st_blocks * 512
        assert allocated0 < 4 * MiB  # sparse: a fresh workspace costs the host almost nothing
        free0, mem0 = shutil.disk_usage(root).free, _meminfo()

        res = run(["python3", "-c", FILL, str(attempt * MiB)], workspace=ws.path, config=cfg)

        free1, mem1 = shutil.disk_usage(root).free, _meminfo()
        written, err = res.stdout.split()
        written = int(written)
        assert res.returncode == 0 and err == "ENOSPC", res.stdout + res.stderr  # the agent sees ENOSPC ...
        assert 0.9 * cap * MiB < written <= cap * MiB  # ... at the cap, not before and not after
        # the data is in the image file on the host's disk, and the image cannot grow past the cap
        allocated = image.stat().st_blocks * 512
        assert written <= allocated <= cap * MiB, (written, allocated)
        # the host's filesystem lost about the cap (not the 1 GiB attempted); margin: other writers
        assert free0 - free1 < cap * MiB + 64 * MiB, (free0 - free1) / MiB
        # and it was not RAM: a tmpfs layer would have taken `written` bytes of unreclaimable
        # memory (Shmem, out of MemAvailable); page cache of the image stays available
        assert mem1["Shmem"] - mem0["Shmem"] < written / 4, (mem1["Shmem"] - mem0["Shmem"]) / MiB
        assert mem0["MemAvailable"] - mem1["MemAvailable"] < written / 2, (
            mem0["MemAvailable"] - mem1["MemAvailable"]) / MiB
        # the workspace still works at the cap: removing files frees room
        (ws.path / "fill0.bin").unlink()
        (ws.path / "after.txt").write_text("room again\n")
        base = ws.base
    # closed: unmounted, image deleted, its loop device detached
    assert not base.exists() and str(base) not in Path("/proc/self/mountinfo").read_text()
    deadline = time.monotonic() + 5
    while _loops_backed_by(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _loops_backed_by(root) == []


@needs_root
def test_the_memory_check_above_fails_on_a_tmpfs_layer(tmp_path: Path, cfg) -> None:
    # The old layer (a tmpfs of the cap) passes ENOSPC but not the memory check: the check can fail.
    ram = tmp_path / "ram"
    ram.mkdir()
    if wsmod._libc.mount(b"tmpfs", str(ram).encode(), b"tmpfs", 0, b"size=64m") != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        mem0 = _meminfo()
        res = run(["python3", "-c", FILL, str(256 * MiB)], workspace=ram, config=cfg)
        mem1 = _meminfo()
        written, err = res.stdout.split()
        assert err == "ENOSPC" and mem1["Shmem"] - mem0["Shmem"] >= int(written) / 2, res.stdout + res.stderr
    finally:
        wsmod._umount(ram)


@needs_root
def test_a_crashed_workspace_is_swept_with_its_image_and_loop_device(tmp_path: Path) -> None:
    tpl, root = _template(tmp_path), tmp_path / "wsroot"
    base, _ = crash_leaving_workspace(tpl, root, disk_mb=16)
    assert (base / "disk").is_mount() and (base / "disk.img").exists() and _loops_backed_by(root)
    assert wsmod.sweep_stale(root) == 1
    assert not base.exists()
    deadline = time.monotonic() + 5
    while _loops_backed_by(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _loops_backed_by(root) == []


@needs_root
def test_more_workspaces_than_preexisting_loop_devices(tmp_path: Path) -> None:
    tpl, root = _template(tmp_path), tmp_path / "wsroot"
    spaces: list[Workspace] = []
    errors: list[BaseException] = []

    def make() -> None:
        try:
            spaces.append(Workspace.create(tpl, kind="copy", root=root, disk_mb=16))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=make) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == [] and len({os.stat(w.path).st_dev for w in spaces}) == 20  # 20 filesystems
    finally:
        for w in spaces:
            w.close()


# -- fails closed ---------------------------------------------------------------------------------
def _cannot_mount(*a: object) -> None:
    raise OSError(errno.EPERM, "loop-mounting a disk image needs a root launcher")


def test_without_a_cap_create_refuses_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wsmod, "_mount_disk_image", _cannot_mount)
    monkeypatch.delenv(wsmod.ALLOW_UNCAPPED_ENV, raising=False)
    tpl, root = _template(tmp_path), tmp_path / "wsroot"
    for kind in ("auto", "copy"):
        with pytest.raises(EtudeError) as info:
            Workspace.create(tpl, kind=kind, root=root)  # type: ignore[arg-type]
        msg = str(info.value)
        assert "\n" not in msg and msg.startswith("cannot cap the workspace's disk at 1024 MiB")
        assert "needs a root launcher" in msg and "disk_mb=None" in msg and wsmod.ALLOW_UNCAPPED_ENV in msg
    assert not list(root.glob("ws-*"))  # nothing left behind


def test_uncapped_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(wsmod, "_mount_disk_image", _cannot_mount)
    monkeypatch.setattr(wsmod, "_quota_warned", threading.Event())
    monkeypatch.delenv(wsmod.ALLOW_UNCAPPED_ENV, raising=False)
    tpl, root = _template(tmp_path), tmp_path / "wsroot"
    with Workspace.create(tpl, kind="copy", root=root, disk_mb=None) as ws:  # explicit: no cap, no attempt
        assert ws.disk_mb is None and (ws.path / "pkg" / "m.py").exists()
    assert capsys.readouterr().err == ""
    with Workspace.create(tpl, kind="copy", root=root, allow_uncapped=True) as ws:  # cap if possible
        assert ws.disk_mb is None and (ws.path / "pkg" / "m.py").exists()
    monkeypatch.setenv(wsmod.ALLOW_UNCAPPED_ENV, "1")
    with Workspace.create(tpl, kind="copy", root=root) as ws:
        assert ws.disk_mb is None
    err = capsys.readouterr().err
    assert err.count("WARNING: workspaces have NO disk cap here") == 1  # loud, once per process
    assert "needs a root launcher" in err
    monkeypatch.setenv(wsmod.ALLOW_UNCAPPED_ENV, "0")
    with pytest.raises(EtudeError, match="cannot cap"):
        Workspace.create(tpl, kind="copy", root=root)


def test_a_non_root_launcher_is_refused_by_the_real_mount_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wsmod.os, "geteuid", lambda: 1000)
    monkeypatch.delenv(wsmod.ALLOW_UNCAPPED_ENV, raising=False)
    with pytest.raises(EtudeError, match="cannot cap the workspace's disk at 8 MiB: .*root launcher"):
        Workspace.create(_template(tmp_path), kind="copy", root=tmp_path / "wsroot", disk_mb=8)
    assert not list((tmp_path / "wsroot").glob("ws-*"))


def test_missing_mkfs_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("a non-root launcher is refused before mkfs is looked for")
    monkeypatch.setattr(wsmod, "_mkfs_tool", lambda: None)
    monkeypatch.delenv(wsmod.ALLOW_UNCAPPED_ENV, raising=False)
    with pytest.raises(EtudeError, match="mkfs.ext4 not found"):
        Workspace.create(_template(tmp_path), kind="copy", root=tmp_path / "wsroot", disk_mb=8)


@needs_root
def test_a_root_on_tmpfs_is_refused_and_the_default_root_avoids_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ram = tmp_path / "ram"
    ram.mkdir()
    if wsmod._libc.mount(b"tmpfs", str(ram).encode(), b"tmpfs", 0, b"size=64m") != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        monkeypatch.delenv(wsmod.ALLOW_UNCAPPED_ENV, raising=False)
        with pytest.raises(EtudeError, match="is on tmpfs \\(memory\\), not disk"):
            Workspace.create(_template(tmp_path), kind="copy", root=ram / "wsroot", disk_mb=8)
        monkeypatch.delenv("ETUDE_WORKSPACES", raising=False)
        monkeypatch.setattr(wsmod.tempfile, "gettempdir", lambda: str(ram))
        if wsmod._memory_fs(Path("/var/tmp")) is None:
            assert wsmod.default_root() == Path("/var/tmp/etude-workspaces")
        monkeypatch.setenv("ETUDE_WORKSPACES", str(tmp_path / "chosen"))
        assert wsmod.default_root() == tmp_path / "chosen"
    finally:
        wsmod._umount(ram)


def _refusal(tpl: Path, root: Path) -> str:
    try:
        ws = Workspace.create(tpl, kind="copy", root=root, disk_mb=8)
    except EtudeError as e:
        return str(e)
    ws.close()
    pytest.fail("the workspace was created")


@needs_root
def test_an_image_cache_others_can_write_is_never_mounted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(wsmod.ALLOW_UNCAPPED_ENV, raising=False)
    tpl, root = _template(tmp_path), tmp_path / "wsroot"
    Workspace.create(tpl, kind="copy", root=root, disk_mb=8).close()
    image = root / ".images" / f"ext4-8m-v{wsmod._IMAGE_VERSION}.img"
    assert image.is_file()
    for path in (root / ".images", image, root):
        path.chmod(path.stat().st_mode | 0o002)  # another user could swap in a crafted filesystem
        try:
            assert "writable by others: refusing to mount" in _refusal(tpl, root)
        finally:
            path.chmod(path.stat().st_mode & ~0o002)
    elsewhere = tmp_path / "elsewhere.img"
    image.rename(elsewhere)
    image.symlink_to(elsewhere)
    assert "is a symlink" in _refusal(tpl, root)
