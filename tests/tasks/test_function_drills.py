"""Fix drills are built inside chosen functions only: every mutant tried sits at a line of one of
them (a drill build used to mutate the whole repository and keep the 10 of 60 bugs that happened
to fall in train functions)."""

import itertools

import pytest

from etude.tasks import curriculum, synth
from etude.tasks.curriculum import enclosing_function, function_lines

SOURCE = '''\
import os


def outer(a, b):
    if a > b:
        return a - b

    def inner(x):
        return x + 1

    return inner(a) * 2


class Box:
    size = 3

    def grow(self, n):
        return self.size + n

    def shrink(self, n):
        return self.size - n
'''


def test_function_lines_match_enclosing_function():
    for wanted in (["outer"], ["outer.inner"], ["Box.grow", "outer"], ["missing"]):
        lines = function_lines(SOURCE, wanted)
        every = range(1, SOURCE.count("\n") + 2)
        assert lines == {ln for ln in every if enclosing_function(SOURCE, ln) in wanted}
    assert 9 in function_lines(SOURCE, ["outer.inner"]) and 9 not in function_lines(SOURCE, ["outer"])
    assert function_lines("def broken(:\n", ["broken"]) == frozenset()


def test_candidates_stay_inside_the_sites(tmp_path):
    pkg = tmp_path / "src" / "lib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text(SOURCE)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_core.py").write_text("def test_x():\n    pass\n")
    rel = "src/lib/core.py"
    everywhere = list(synth.candidates(tmp_path, synth.SynthConfig(mutators=curriculum.LEVEL1_MUTATORS)))
    assert {c.lines[0] for c in everywhere} - function_lines(SOURCE, ["Box.grow"])  # sites elsewhere exist
    sites = {rel: function_lines(SOURCE, ["Box.grow"])}
    chosen = list(synth.candidates(tmp_path, synth.SynthConfig(mutators=curriculum.LEVEL1_MUTATORS, sites=sites)))
    assert chosen and all(c.rel == rel and c.lines[0] in sites[rel] for c in chosen)
    assert {c.patch for c in chosen} == {c.patch for c in everywhere if c.lines[0] in sites[rel]}


@pytest.mark.slow
def test_function_curriculum_builds_validated_bugs_in_the_functions_only(tmp_path, monkeypatch):
    from etude.pipeline.specialise import example_org_repo, repo_tasks
    from etude.pipeline.split import touched_functions

    monkeypatch.setenv("ETUDE_HOME", str(tmp_path / "home"))
    repo = example_org_repo(tmp_path / "acme-lib")
    fns = sorted({f for t in repo_tasks(str(repo), 12, 0) for f in touched_functions(t)})
    chosen = set(itertools.islice(fns, 0, None, 2))
    drills = curriculum.function_curriculum(str(repo), chosen, 6, seed=7)
    assert drills and len(drills) <= 6
    assert all(touched_functions(t) <= chosen for t in drills)
    assert all(t.meta["level"] == 1 and t.FAIL_TO_PASS for t in drills)
    assert curriculum.function_curriculum(str(repo), {"nowhere.py::f"}, 6, seed=7) == []


def test_site_lines_are_the_lines_mutate_reports():
    from etude.tasks.mutators import count_sites, mutate, site_lines

    for m in curriculum.LEVEL1_MUTATORS:
        lines = site_lines(SOURCE, m)
        assert len(lines) == count_sites(SOURCE, m)
        for i, ln in enumerate(lines):
            mut = mutate(SOURCE, m, i)
            assert mut is None or mut.line == ln
