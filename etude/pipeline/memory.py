"""Peak resident memory of a run, all its processes together (this process and every
descendant: sandboxes, Ray workers, vLLM's engine), sampled in a background thread.

`with PeakMemory() as pm: ...; pm.peak_gib` — the largest sum of PSS seen (proportional set size:
each process's private pages plus its share of the pages it shares, read from
/proc/PID/smaps_rollup), which is what the processes hold together. The sum of RSS is kept beside
it (`peak_rss_sum_gib`) but overcounts: vLLM's engine, Ray's workers and forked sandboxes map the
same model weights, shared memory and libraries, and RSS counts them once per process (the first
full demo run recorded 23.6 GiB of summed RSS on a 24 GiB machine that never ran short).
What this does not catch: a spike shorter than the sampling interval (0.5 s), or memory of
processes that were started outside this process tree (a Ray cluster joined by address)."""

from __future__ import annotations

import os
import threading
from typing import Any


class PeakMemory:
    def __init__(self, interval_s: float = 0.5):
        self.interval_s = interval_s
        self.peak_bytes = 0  # summed PSS
        self.peak_rss_sum_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> int:
        import psutil

        try:
            me = psutil.Process(os.getpid())
            procs = [me, *me.children(recursive=True)]
        except psutil.Error:
            return 0
        total = rss = 0
        for p in procs:
            try:
                full = p.memory_full_info()  # pss where the kernel has smaps_rollup (Linux)
            except psutil.Error:
                continue
            rss += full.rss
            total += getattr(full, "pss", full.rss)
        self.peak_bytes = max(self.peak_bytes, total)
        self.peak_rss_sum_bytes = max(self.peak_rss_sum_bytes, rss)
        self.samples += 1
        return total

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> PeakMemory:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="peak-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample()

    @property
    def peak_gib(self) -> float:
        return round(self.peak_bytes / 2**30, 2)

    def to_dict(self) -> dict[str, Any]:
        return {"peak_pss_gib": self.peak_gib, "peak_rss_sum_gib": round(self.peak_rss_sum_bytes / 2**30, 2),
                "samples": self.samples, "interval_s": self.interval_s,
                "scope": "this process and all its descendants, summed PSS (summed RSS beside it, overcounting "
                         "shared pages)"}
