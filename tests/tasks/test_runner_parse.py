"""Reading pytest's verbose and summary output into per-test statuses."""

from etude.tasks.runner import TestRun, parse_pytest_output
from etude.tasks.validate import classify

OUT = """\
============================= test session starts ==============================
collecting ... collected 6 items / 1 error

tests/test_a.py::test_ok PASSED                                          [ 16%]
tests/test_a.py::test_bad FAILED                                         [ 33%]
tests/test_a.py::test_param[a - b] PASSED                                [ 50%]
tests/test_a.py::test_teardown PASSED                                    [ 66%]
tests/test_a.py::test_teardown ERROR                                     [ 66%]
tests/test_a.py::test_skip SKIPPED (no network)                          [ 83%]
tests/test_a.py::TestK::test_x XFAIL (known)                             [100%]

=========================== short test summary info ============================
FAILED tests/test_a.py::test_bad - AssertionError: assert 1 == 2
ERROR tests/test_a.py::test_teardown - RuntimeError: boom
ERROR tests/test_b.py - ImportError: cannot import name 'thing' from 'pkg'
============== 1 failed, 3 passed, 1 skipped, 1 xfailed, 2 errors in 0.12s ==============
"""


def test_parse_verbose_and_summary():
    status, messages = parse_pytest_output(OUT)
    assert status == {
        "tests/test_a.py::test_ok": "passed",
        "tests/test_a.py::test_bad": "failed",
        "tests/test_a.py::test_param[a - b]": "passed",
        "tests/test_a.py::test_teardown": "error",  # the worse of passed and a teardown error
        "tests/test_a.py::test_skip": "skipped",
        "tests/test_a.py::TestK::test_x": "xfailed",
    }
    assert messages["tests/test_a.py::test_bad"] == "AssertionError: assert 1 == 2"
    assert messages["tests/test_b.py"].startswith("ImportError: cannot import name 'thing'")


def _run(**status):
    return TestRun({k.replace("_", "::", 1): v for k, v in status.items()})


def test_classify_excludes_flaky_and_broken_tests():
    base = [_run(a_f2p="failed", a_p2p="passed", a_flaky="passed", a_broken="failed", a_skip="skipped"),
            _run(a_f2p="error", a_p2p="passed", a_flaky="failed", a_broken="failed", a_skip="skipped")]  # fmt: skip
    gold = [_run(a_f2p="passed", a_p2p="passed", a_flaky="passed", a_broken="failed", a_skip="skipped", b_new="passed"),
            _run(a_f2p="passed", a_p2p="passed", a_flaky="passed", a_broken="failed", a_skip="skipped", b_new="passed")]  # fmt: skip
    f2p, p2p, flaky = classify(base, gold)
    assert f2p == ["a::f2p", "b::new"]  # missing at base (its file b did not import) counts as failing there
    assert p2p == ["a::p2p"]
    assert flaky == ["a::flaky"]


def test_unstable_parametrize_ids_are_flaky_not_fail_to_pass():
    """Regression: isodate builds some parametrize ids from unordered data, so a test id seen in
    the reference runs can be absent (not failing) in the mutant's run; it was taken for F2P."""
    ref = [_run(**{"f_g[x-1]": "passed", "f_g[y-2]": "passed", "f_ok": "passed"}),
           _run(**{"f_g[x-2]": "passed", "f_g[y-1]": "passed", "f_ok": "passed"})]  # fmt: skip
    mutant = [_run(**{"f_g[x-1]": "passed", "f_g[y-3]": "passed", "f_ok": "failed", "h_only": "passed"})]
    f2p, p2p, flaky = classify(mutant, ref)
    assert f2p == ["f::ok"] and p2p == []
    assert {"f::g[x-1]", "f::g[y-2]", "f::g[x-2]", "f::g[y-1]", "f::g[y-3]"} <= set(flaky)
