"""pass@k, bootstrap intervals and paired tests against values worked out by hand."""

import math

import numpy as np
import pytest

from etude.evals.stats import (
    bootstrap_ci,
    mcnemar_exact,
    mean_ci,
    paired_test,
    pass_at_k,
    quantile,
    wilcoxon_p,
)


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


def test_wilson_interval_of_a_handful_of_tasks_is_never_zero_width():
    from etude.evals.stats import wilson_ci

    low, high = wilson_ci(0, 2)
    assert low == 0.0 and high == pytest.approx(0.6576, abs=1e-3)  # not the bootstrap's [0, 0]
    assert mean_ci([0.0, 0.0]) == {"mean": 0.0, "ci_low": 0.0, "ci_high": pytest.approx(0.6576, abs=1e-3), "n": 2}
    for n in range(1, 60):  # the interval holds the estimate exactly at the ends (0/3 once gave 5.6e-17)
        assert wilson_ci(0, n)[0] == 0.0 and wilson_ci(n, n)[1] == 1.0
    low, high = wilson_ci(7, 10)
    assert low == pytest.approx(0.3968, abs=1e-3) and high == pytest.approx(0.8922, abs=1e-3)
    # non-0/1 values keep the bootstrap
    assert mean_ci([0.5, 0.5])["ci_low"] == 0.5


def test_tango_interval_solves_the_score_equation_and_covers():
    import numpy as np

    from etude.evals.stats import tango_ci, tango_score

    low, high = tango_ci(3, 9, 40)
    assert low < 6 / 40 < high
    assert float(tango_score(3, 9, 40, low)) == pytest.approx(1.959964, abs=1e-5)
    assert float(tango_score(3, 9, 40, high)) == pytest.approx(-1.959964, abs=1e-5)
    assert tango_ci(0, 0, 30)[0] == pytest.approx(-tango_ci(0, 0, 30)[1]) and tango_ci(0, 0, 30)[0] < -0.1
    assert tango_ci(0, 0, 120)[0] > -0.05  # more tasks, tighter
    rng = np.random.default_rng(0)
    p_loss, p_gain, n = 0.15, 0.05, 40
    hits = 0
    for _ in range(800):
        lo, ga, _ = rng.multinomial(n, [p_loss, p_gain, 1 - p_loss - p_gain])
        a, b = tango_ci(int(lo), int(ga), n)
        hits += a <= p_gain - p_loss <= b
    assert hits / 800 > 0.93


def test_noninferiority_test_is_exact_on_the_boundary():
    """The rejection region at level 0.025, evaluated exactly (multinomial sums) along the whole
    boundary p_gain − p_loss = −margin: its probability never exceeds 0.025 (up to the grid)."""
    import numpy as np
    from scipy.stats import multinomial

    from etude.evals.stats import noninferiority_p

    n, margin = 20, 0.1
    region = [(lo, ga) for lo in range(n + 1) for ga in range(n + 1 - lo) if noninferiority_p(lo, ga, n, margin) < 0.025]
    assert (0, 0) not in region and (0, 8) in region  # 8 gains, no loss: non-inferior
    for q in np.linspace(margin, (1 + margin) / 2, 37):
        probs = [q, max(q - margin, 0.0), max(1 - 2 * q + margin, 0.0)]
        size = sum(multinomial.pmf([lo, ga, n - lo - ga], n, probs) for lo, ga in region)
        assert size <= 0.025 + 1e-3
    # a bigger margin is easier to meet; more tasks without a loss make it easier too
    assert noninferiority_p(0, 0, 60, 0.1) < noninferiority_p(0, 0, 60, 0.05) < noninferiority_p(0, 0, 30, 0.05)


def test_paired_summary_counts_discordant_tasks_and_tests_them():
    from etude.evals.stats import paired_summary

    s = paired_summary([1, 0, 0, 1, 0, 0], [1, 1, 1, 0, 1, 0])
    assert (s["tasks"], s["b_only"], s["a_only"]) == (6, 3, 1)
    assert s["gain_points"] == 2 / 6 and s["mcnemar_p"] == mcnemar_exact([1, 0, 0, 1, 0, 0], [1, 1, 1, 0, 1, 0])


def test_quantile_is_numpys_linear_percentile_and_refuses_bad_input():
    xs = [3.0, 1.0, 7.5, 2.0, 10.0, 4.25]
    for q in (0.0, 0.1, 0.5, 0.95, 1.0):
        assert quantile(xs, q) == pytest.approx(float(np.percentile(xs, q * 100)))
    assert quantile([5.0], 0.95) == 5.0
    with pytest.raises(ValueError):
        quantile([], 0.5)
    with pytest.raises(ValueError):
        quantile(xs, 1.5)
