"""In-sandbox supervisor of a session sandbox (etude.sandbox.session). Standard library only.

It runs as `python -I -S -c <this file>` inside one long-lived bwrap (pid 2 of its PID namespace,
under bwrap's own init) and serves one command at a time over stdin/stdout: 4-byte big-endian
length + JSON. Per command: bounded capture of stdout/stderr, a wall-clock deadline (the rlimits
are inherited from the session's launcher), and, when the
command exits or times out, `kill(-1, SIGKILL)`: every process in the namespace except init and
this supervisor, setsid ones included. So nothing a command starts outlives it, as with `run`.
"""

import json
import os
import selectors
import signal
import struct
import subprocess
import sys
import time

IN, OUT = sys.stdin.buffer, sys.stdout.buffer
CHUNK = 65536


class Buf:
    """Head and tail of a stream, at most `limit` bytes kept (same policy as capture.py)."""

    def __init__(self, limit):
        self.half, self.head, self.tail, self.dropped = max(limit // 2, 1), bytearray(), bytearray(), 0

    def feed(self, data):
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > 2 * self.half:
            drop = len(self.tail) - self.half
            del self.tail[:drop]
            self.dropped += drop

    def text(self):
        tail, dropped = self.tail, self.dropped
        if len(tail) > self.half:
            dropped += len(tail) - self.half
            tail = tail[len(tail) - self.half :]
        head = bytes(self.head).decode("utf-8", "replace")
        mid = f"\n[... {dropped} bytes of output omitted ...]\n" if dropped else ""
        return head + mid + bytes(tail).decode("utf-8", "replace"), bool(dropped)


def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = IN.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def recv():
    head = read_exact(4)
    if head is None:
        return None
    body = read_exact(struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


def send(obj):
    body = json.dumps(obj).encode()
    OUT.write(struct.pack(">I", len(body)) + body)
    OUT.flush()


def kill_all(deadline_s=5.0):
    """SIGKILL everything in the namespace but init and us, until nothing is left."""
    end, pause = time.monotonic() + deadline_s, 0.0002
    while time.monotonic() < end:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
        reap()
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def reap():
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def pump(proc, pidfd, pending, out, err, deadline):
    """Move bytes until the command exits; True when the deadline passed first."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    sel.register(pidfd, selectors.EVENT_READ, "exit")
    if pending:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, "stdin")
    elif proc.stdin:
        proc.stdin.close()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            for key, _ in sel.select(timeout=left):
                if key.data == "exit":
                    return False
                if key.data == "stdin":
                    pending = write_some(proc, sel, pending)
                elif chunk := os.read(key.fd, CHUNK):
                    key.data.feed(chunk)
                else:
                    sel.unregister(key.fileobj)
    finally:
        sel.close()


def write_some(proc, sel, pending):
    try:
        n = os.write(proc.stdin.fileno(), pending[:CHUNK])
        pending = pending[n:]
    except BlockingIOError:
        return pending
    except OSError:
        pending = b""
    if not pending:
        sel.unregister(proc.stdin)
        proc.stdin.close()
    return pending


def drain(proc, out, err, wait_s=2.0):
    """After the kill: collect what is left in the pipes (every writer is gone, so EOF comes)."""
    sel = selectors.DefaultSelector()
    for f, buf in ((proc.stdout, out), (proc.stderr, err)):
        sel.register(f, selectors.EVENT_READ, buf)
    end = time.monotonic() + wait_s
    try:
        while sel.get_map() and (left := end - time.monotonic()) > 0:
            for key, _ in sel.select(timeout=left):
                if chunk := os.read(key.fd, CHUNK):
                    key.data.feed(chunk)
                else:
                    sel.unregister(key.fileobj)
    finally:
        sel.close()


def run_one(req):
    limit = req["max_output"]
    out, err = Buf(limit), Buf(limit)
    stdin = req.get("stdin")
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            req["argv"],
            cwd="/workspace",
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        name = req["argv"][0] if req["argv"] else ""
        return {
            "rc": 127,
            "stdout": "",
            "stderr": f"sandbox: cannot run {name!r}: {e.strerror}\n",
            "timed_out": False,
            "truncated": False,
            "wall_s": time.monotonic() - t0,
        }
    pidfd = os.pidfd_open(proc.pid)
    try:
        timed_out = pump(proc, pidfd, stdin.encode() if stdin else b"", out, err, t0 + req["timeout"])
    finally:
        os.close(pidfd)
    if timed_out:
        proc.kill()
    code = proc.wait()  # before kill_all, whose reaping would swallow the status
    kill_all()
    drain(proc, out, err)
    proc.stdout.close()
    proc.stderr.close()
    so, t1 = out.text()
    se, t2 = err.text()
    return {
        "rc": 128 - code if code < 0 else code,
        "stdout": so,
        "stderr": se,
        "timed_out": timed_out,
        "truncated": t1 or t2,
        "wall_s": time.monotonic() - t0,
    }


def harden():
    """Non-dumpable: a command (same uid, no capabilities) can then neither ptrace us, read our
    memory, nor open our pipes through /proc/<pid>/fd. It can still signal us (the host copes)."""
    import ctypes

    pr_set_dumpable = 4
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_dumpable, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def main():
    harden()
    send({"ready": os.getpid()})
    while (req := recv()) is not None:
        reply = run_one(req)
        reply["id"] = req.get("id")
        send(reply)


main()
