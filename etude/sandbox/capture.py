"""Bounded output capture: keep the head and the tail of a stream, count what was dropped.

A command that prints gigabytes costs us at most `2 * half` bytes of memory per stream; the
middle is dropped and replaced by one marker line so the model still sees how it started and ended.
"""

from __future__ import annotations


class BoundedBuffer:
    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        if len(self.tail) > 2 * self.half:
            # NOTE: trim only once the tail is twice too big, so feed() stays O(n) overall.
            drop = len(self.tail) - self.half
            del self.tail[:drop]
            self.dropped += drop

    @property
    def truncated(self) -> bool:
        return self.dropped > 0 or len(self.tail) > self.half

    def text(self) -> str:
        tail = self.tail
        dropped = self.dropped
        if len(tail) > self.half:
            dropped += len(tail) - self.half
            tail = tail[len(tail) - self.half :]
        if not dropped:
            return (bytes(self.head) + bytes(tail)).decode("utf-8", errors="replace")
        marker = f"\n[... {dropped} bytes of output omitted ...]\n"
        return bytes(self.head).decode("utf-8", "replace") + marker + bytes(tail).decode("utf-8", "replace")
