"""Holm's correction (several checkpoints on one held-out set) and the non-inferiority test of
paired continuous values (the trainer-vs-TRL reward check)."""

from __future__ import annotations

import numpy as np
import pytest

from etude.evals.stats import holm, paired_noninferiority


def test_holm_steps_down_and_keeps_the_input_order():
    # sorted: 0.01*4, 0.02*3, 0.03*2 -> max(.04,.06)=.06 ... monotone, capped at 1
    assert holm([0.03, 0.01, 0.5, 0.02]) == pytest.approx([0.06, 0.04, 0.5, 0.06])
    assert holm([0.6, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == [] and holm([0.2]) == [0.2]


def test_holm_matches_statsmodels():
    multipletests = pytest.importorskip("statsmodels.stats.multitest").multipletests
    p = list(np.random.default_rng(3).uniform(0, 0.2, size=9))
    assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))


def test_best_of_five_checkpoints_is_not_significant_after_holm():
    # issue 29: the no-split figure was the best of five checkpoints, p = 0.031 uncorrected
    assert holm([0.031, 0.5, 0.7, 0.9, 1.0])[0] == pytest.approx(0.155)


def test_noninferiority_fails_when_b_is_clearly_worse():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.4, 0.8, 64)
    r = paired_noninferiority(a, a - 0.3 + rng.normal(0, 0.05, 64), margin=0.05)
    assert not r["noninferior"] and r["p"] > 0.99 and r["lower_bound"] < -0.05
    assert r["n"] == 64 and r["margin"] == 0.05 and 0 < r["power_at_margin"] <= 1


def test_noninferiority_passes_when_equal_with_enough_units():
    rng = np.random.default_rng(1)
    a = rng.uniform(0, 1, 400)
    r = paired_noninferiority(a, a + rng.normal(0, 0.2, 400), margin=0.05)
    assert r["noninferior"] and r["p"] < 0.05 and r["lower_bound"] > -0.05
    assert r["power_at_margin"] > 0.9 and r["n_for_power"] < 400


def test_noninferiority_is_not_shown_on_a_handful_of_noisy_units():
    # equal in truth, but 8 units with sd 0.4 cannot show a 0.05 margin: low power, not "equal"
    rng = np.random.default_rng(2)
    a = rng.uniform(0, 1, 8)
    r = paired_noninferiority(a, a + rng.normal(0, 0.4, 8), margin=0.05)
    assert not r["noninferior"] and r["power_at_margin"] < 0.2 and r["n_for_power"] > 100


def test_noninferiority_edge_cases():
    assert not paired_noninferiority([0.5], [0.5], 0.05)["noninferior"]  # one unit: never shown
    same = paired_noninferiority([0.1, 0.2, 0.3], [0.1, 0.2, 0.3], 0.05)
    assert same["noninferior"] and same["p"] == 0.0 and same["power_at_margin"] is None
    with pytest.raises(ValueError):
        paired_noninferiority([0.1, 0.2], [0.1, 0.2], -0.1)
