"""A curriculum slice is the first tasks of each package's whole build, whether or not the whole
build is cached (a fresh machine's demo got 27 tasks where a warm one got 30, and other ones)."""

from types import SimpleNamespace

from etude.tasks import curriculum
from etude.types import Task

SPEC = "isodate==0.7.2"


def _task(i: int) -> Task:
    return Task(f"isodate__synth-op_flip-{i:010d}", "pypi/isodate", "b", "", "", "s")


def _fake(monkeypatch, tmp_path, calls):
    monkeypatch.setenv("ETUDE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(curriculum, "fetch_sdist", lambda *a: SimpleNamespace(root=tmp_path))
    # every third synthesised task has no enclosing function: level 1 drops it
    monkeypatch.setattr(curriculum, "_restate", lambda t, level, root: None if int(t.instance_id[-1]) % 3 == 2 else t)

    def synthesise(spec, cfg, progress, enough):
        calls.append(cfg.max_tasks)
        out = []
        for i in range(cfg.max_tasks):
            out.append(_task(i))
            if enough is not None and enough(out[-1]):
                break
        return out

    monkeypatch.setattr(curriculum, "synthesise", synthesise)


def test_a_slice_built_alone_is_the_start_of_the_whole_build(monkeypatch, tmp_path):
    calls = []
    _fake(monkeypatch, tmp_path, calls)
    part = curriculum.package_curriculum(SPEC, 1, 9, first=4)
    whole = curriculum.package_curriculum(SPEC, 1, 9)
    assert calls == [9, 9]  # the slice used the whole build's budget, and stopped early
    assert len(whole) == 6 and part == whole[:4]
    assert curriculum.package_curriculum(SPEC, 1, 9, first=4) == part and calls == [9, 9]  # cached


def test_a_slice_reads_the_whole_build_when_it_is_cached(monkeypatch, tmp_path):
    calls = []
    _fake(monkeypatch, tmp_path, calls)
    whole = curriculum.package_curriculum(SPEC, 1, 9)
    assert curriculum.package_curriculum(SPEC, 1, 9, first=3) == whole[:3] and calls == [9]
