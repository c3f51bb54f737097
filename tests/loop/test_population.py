"""The simulated users' behaviour model: seeded, one repository per user, reactions that depend
on correctness only through their documented probabilities."""

from __future__ import annotations

import random

import pytest

from etude.errors import EtudeError
from etude.loop.population import UserModel, make_population, repo_of, session_rng
from etude.types import Task


def _task(i: int, pkg: str) -> Task:
    return Task(instance_id=f"{pkg}-{i}", repo=pkg, base_commit="", problem_statement=f"bug {i}", patch="",
                test_patch="", FAIL_TO_PASS=(), PASS_TO_PASS=(), source={"package": pkg})


TASKS = [_task(i, pkg) for pkg in ("jmespath", "colorama") for i in range(5)]


def test_each_user_has_one_repository_and_a_seeded_stream_of_its_tasks() -> None:
    users = make_population(TASKS, 6, seed=3)
    assert users == make_population(TASKS, 6, seed=3)  # seeded
    assert users != make_population(TASKS, 6, seed=4)
    assert {u.repo for u in users} == {"jmespath", "colorama"}
    for u in users:
        assert len(u.tasks) == 5 and all(repo_of(t) == u.repo for t in u.tasks)
        assert u.request(0) == u.request(5)  # the stream cycles
    assert len({u.leniency for u in users}) == 6  # people differ
    with pytest.raises(EtudeError):
        make_population([], 3)
    with pytest.raises(EtudeError, match="probabilities"):
        UserModel(p_keep_good=1.5)


def test_reactions_follow_the_probabilities_of_the_users_view() -> None:
    m = UserModel(user_sd=0.0)
    rng = random.Random(0)
    n = 20_000
    for correct, keep, dis in ((True, m.p_keep_good, m.p_dissatisfied_good), (False, m.p_keep_bad, m.p_dissatisfied_bad)):
        rs = [m.react(correct, rng) for _ in range(n)]
        assert sum(r.kept for r in rs) / n == pytest.approx(keep, abs=0.015)
        assert sum(r.abandoned for r in rs) / n == pytest.approx(m.p_abandon, abs=0.015)
        assert all(r.followup is None for r in rs if r.abandoned)  # abandoned: no follow-up
        explicit = [r for r in rs if not r.abandoned]
        assert sum(r.followup == "dissatisfied" for r in explicit) / len(explicit) == pytest.approx(dis, abs=0.015)
        mean = m.overwrite_good if correct else m.overwrite_bad
        assert sum(r.overwrite_share for r in rs) / n == pytest.approx(mean, abs=0.01)
    # a lenient user keeps more and complains less than a strict one, for the same change
    lenient = [m.react(False, rng, leniency=1.0) for _ in range(n)]
    strict = [m.react(False, rng, leniency=-1.0) for _ in range(n)]
    assert sum(r.kept for r in lenient) > sum(r.kept for r in strict)
    assert sum(r.followup == "dissatisfied" for r in lenient) < sum(r.followup == "dissatisfied" for r in strict)


def test_the_default_signal_is_weak_like_production() -> None:
    """The docstring's figures: a 5-point resolved-rate gain at 30% moves keep by +4.6% and the
    dissatisfied rate by -5.0% (relative); one keep/reject is right about 72% of the time."""
    m = UserModel()
    a, b = m.expected(0.30), m.expected(0.35)
    assert b["keep_rate"] / a["keep_rate"] - 1 == pytest.approx(0.046, abs=0.001)
    assert b["dissatisfied_rate"] / a["dissatisfied_rate"] - 1 == pytest.approx(-0.050, abs=0.001)
    assert (m.p_keep_good + 1 - m.p_keep_bad) / 2 == pytest.approx(0.725)


def test_session_streams_are_reproducible() -> None:
    u = make_population(TASKS, 2, seed=0)[0]
    assert session_rng(u, "c1:collect:0", 0).random() == session_rng(u, "c1:collect:0", 0).random()
    assert session_rng(u, "c1:collect:0", 0).random() != session_rng(u, "c1:canary:0", 0).random()
