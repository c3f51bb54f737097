"""pass@k, bootstrap intervals and paired tests against values worked out by hand."""

import math

import pytest

from etude.evals.stats import bootstrap_ci, mcnemar_exact, mean_ci, paired_test, pass_at_k, wilcoxon_p


def test_pass_at_k_matches_the_closed_form():
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    assert pass_at_k(3, 1, 3) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_bootstrap_interval_brackets_the_mean_and_is_reproducible():
    x = [0, 1, 1, 0, 1, 1, 1, 0, 1, 1]
    low, high = bootstrap_ci(x, resamples=4000, seed=1)
    assert low < 0.7 < high and 0.3 < low and high <= 1.0
    assert (low, high) == bootstrap_ci(x, resamples=4000, seed=1)
    assert bootstrap_ci([2.0, 2.0]) == (2.0, 2.0)
    assert mean_ci([]) == {"mean": None, "ci_low": None, "ci_high": None, "n": 0}


def test_mcnemar_counts_only_discordant_pairs():
    a = [1] * 10 + [0] * 5
    b = [0] * 10 + [0] * 5  # 10 tasks lost, none gained: p = 2 * 0.5**10
    assert mcnemar_exact(a, b) == pytest.approx(2 * 0.5**10)
    assert mcnemar_exact([1, 0], [1, 0]) == 1.0
    assert paired_test(a, b)[1] == "mcnemar-exact"


def test_wilcoxon_for_continuous_values():
    assert wilcoxon_p([0, 0, 0]) == 1.0
    p = wilcoxon_p([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    assert p == pytest.approx(2 / 2**8)  # exact: all ranks positive
    assert paired_test([0.2, 0.4], [0.3, 0.9])[1] == "wilcoxon"
