"""PeakMemory sums what the process tree holds (PSS), not RSS once per process: pages shared by
forked children count once in total, while summed RSS counts them in every child."""

from __future__ import annotations

import multiprocessing as mp
import time

from etude.pipeline.memory import PeakMemory

MIB = 2**20


def _sleep(ready, stop) -> None:
    ready.set()
    stop.wait(30)


def test_shared_pages_of_forked_children_count_once():
    block = bytearray(256 * MIB)
    block[:: 4096] = b"x" * (len(block) // 4096)  # touch every page: resident in the parent
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    children = []
    for _ in range(3):
        ready = ctx.Event()
        p = ctx.Process(target=_sleep, args=(ready, stop))
        p.start()
        assert ready.wait(30)
        children.append(p)
    try:
        pm = PeakMemory()
        pm.sample()
    finally:
        stop.set()
        for p in children:
            p.join(30)
    d = pm.to_dict()
    # the 256 MiB block is resident in four processes: RSS counts it four times, PSS once
    assert pm.peak_rss_sum_bytes >= 4 * 256 * MIB * 0.9
    assert 256 * MIB * 0.9 <= pm.peak_bytes < pm.peak_rss_sum_bytes / 2
    assert d["peak_pss_gib"] < d["peak_rss_sum_gib"]
    del block


def test_the_background_sampler_sees_a_child_that_comes_and_goes():
    ctx = mp.get_context("spawn")
    with PeakMemory(interval_s=0.05) as pm:
        p = ctx.Process(target=_hold, args=(192,))
        p.start()
        p.join(60)
    assert p.exitcode == 0
    assert pm.samples >= 2
    assert pm.peak_bytes >= 192 * MIB * 0.9


def _hold(mib: int) -> None:
    block = bytearray(mib * MIB)
    block[:: 4096] = b"y" * (len(block) // 4096)
    time.sleep(1.0)
