"""bench/verify.py: figures recomputed from the records beside them; an edited figure, records
file or a file without provenance fails, naming the file and field; legacy/ is skipped, counted."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from etude.evals.results import ResultError, write_result
from etude.evals.stats import mcnemar_exact, wilson_ci
from etude.experiments.analysis import ABConfig, analyze_metric
from etude.provenance import provenance
from tests.bench import BENCH_DIR, load_bench

verify = load_bench("verify")

# three arms on one 20-task held-out set: base resolves 2, two checkpoints 8 and 5
BASE = [1, 1] + [0] * 18
CK1 = [1, 1, 1, 1, 1, 1, 1, 1] + [0] * 12
CK2 = [1, 0, 1, 1, 1, 1] + [0] * 14
RECORDS = [{"arm": arm, "task": f"t{i}", "resolved": v}
           for arm, vals in (("base", BASE), ("ck1", CK1), ("ck2", CK2)) for i, v in enumerate(vals)]
FIGURES = {
    "base": {"kind": "rate", "of": {"arm": "base"}, "field": "resolved"},
    "ck1": {"kind": "rate", "of": {"arm": "ck1"}, "field": "resolved"},
    "ck1_vs_base": {"kind": "paired", "a": {"arm": "base"}, "b": {"arm": "ck1"}, "key": "task", "field": "resolved",
                    "family": "checkpoints"},
    "ck2_vs_base": {"kind": "paired", "a": {"arm": "base"}, "b": {"arm": "ck2"}, "key": "task", "field": "resolved",
                    "family": "checkpoints"},
}


def _write(d: Path, stem: str = "probe") -> Path:
    prov = provenance(seeds={"eval": 0}, started=0.0, argv=["bench/probe.py"])
    write_result(d / f"{stem}.json", FIGURES, RECORDS, prov, meta={"tasks": 20})
    return d / f"{stem}.json"


def _edit(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc, indent=1))


def _run(d: Path, capsys) -> tuple[int, str]:
    rc = verify.main(["--results", str(d)])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_agreeing_files_pass_and_carry_the_recomputed_figures(tmp_path, capsys):
    path = _write(tmp_path)
    assert (tmp_path / "probe.records.jsonl").is_file()
    figs = json.loads(path.read_text())["figures"]
    assert (figs["ck1"]["k"], figs["ck1"]["n"], figs["ck1"]["rate"]) == (8, 20, 0.4)
    assert (figs["ck1"]["ci_low"], figs["ck1"]["ci_high"]) == pytest.approx(wilson_ci(8, 20))
    assert figs["ck1_vs_base"]["p"] == pytest.approx(mcnemar_exact(BASE, CK1))
    assert figs["ck1_vs_base"]["gain"] == pytest.approx(0.3)
    # two checkpoints on one held-out set: how many, and Holm's p (2 x the smaller p here)
    assert figs["ck1_vs_base"]["comparisons"] == 2
    assert figs["ck1_vs_base"]["p_holm"] == pytest.approx(min(1, 2 * figs["ck1_vs_base"]["p"]))
    rc, out = _run(tmp_path, capsys)
    assert rc == 0 and "1 of 1 result files verified" in out


def test_a_value_rounded_in_the_last_place_still_passes(tmp_path, capsys):
    path = _write(tmp_path)
    _edit(path, lambda d: d["figures"]["base"].update(ci_high=round(d["figures"]["base"]["ci_high"], 4)))
    assert _run(tmp_path, capsys)[0] == 0


@pytest.mark.parametrize(("figure", "field", "value"), [
    ("ck1", "rate", 0.45), ("ck1_vs_base", "p", 0.001), ("ck2_vs_base", "p_holm", 0.02), ("ck1", "k", 9),
    ("ck1", "ci_low", 0.2),
])
def test_an_edited_figure_fails_naming_file_field_stored_and_recomputed(tmp_path, capsys, figure, field, value):
    path = _write(tmp_path)
    _edit(path, lambda d: d["figures"][figure].update({field: value}))
    rc, out = _run(tmp_path, capsys)
    assert rc == 1
    line = next(ln for ln in out.splitlines() if ln.startswith("FAIL"))
    assert str(path) in line and f"figure {figure}.{field}: stored {value!r}, recomputed" in line


def test_a_hand_written_field_in_a_figure_fails(tmp_path, capsys):
    path = _write(tmp_path)
    _edit(path, lambda d: d["figures"]["ck1"].update(note="looks good"))
    rc, out = _run(tmp_path, capsys)
    assert rc == 1 and "note" in out and "not computed from the records" in out


def test_edited_records_fail_on_their_digest(tmp_path, capsys):
    _write(tmp_path)
    rec = tmp_path / "probe.records.jsonl"
    rec.write_text(rec.read_text().replace('"resolved": 0', '"resolved": 1', 1))
    rc, out = _run(tmp_path, capsys)
    assert rc == 1 and "records.sha256" in out and "figure base.k: stored 2, recomputed 3" in out


def test_files_without_provenance_or_records_do_not_pass_silently(tmp_path, capsys):
    (tmp_path / "old.json").write_text(json.dumps({"resolved": 3, "note": "by hand"}))
    path = _write(tmp_path)
    (tmp_path / "probe.records.jsonl").unlink()
    _edit(path, lambda d: d.pop("provenance"))
    rc, out = _run(tmp_path, capsys)
    assert rc == 1 and "0 of 2 result files verified" in out
    assert f"{tmp_path / 'old.json'}: no provenance" in out and "probe.records.jsonl" in out


def test_legacy_is_skipped_explicitly_and_counted(tmp_path, capsys):
    (tmp_path / "legacy" / "sub").mkdir(parents=True)
    for p in ("legacy/a.json", "legacy/sub/b.json"):
        (tmp_path / p).write_text("{}")
    _write(tmp_path)
    rc, out = _run(tmp_path, capsys)
    assert rc == 0 and "skipped 2 legacy files" in out


def test_write_result_refuses_a_figure_the_records_do_not_give(tmp_path):
    prov = provenance(argv=["x"])
    with pytest.raises(ResultError, match="ck1.rate"):
        write_result(tmp_path / "x.json", {"ck1": {**FIGURES["ck1"], "rate": 0.5}}, RECORDS, prov)
    with pytest.raises(ResultError, match="provenance"):
        write_result(tmp_path / "x.json", FIGURES, RECORDS, {})
    assert not list(tmp_path.iterdir())


def test_the_real_bench_results_verify(capsys):
    results = BENCH_DIR / "results"
    rc, out = _run(results, capsys)
    assert rc == 0, out
    assert f"skipped {len(list((results / 'legacy').rglob('*.json')))} legacy files" in out
    assert (results / "legacy" / "README.md").is_file()


# a load phase of each of two servers: request i answered end_s seconds after the phase began
LOAD = ([{"engine": "ours", "request": i, "end_s": e, "latency_s": lat} for i, (e, lat) in
         enumerate([(1.0, 1.0), (2.0, 1.0), (2.5, 1.5), (4.0, 1.5)])]
        + [{"engine": "raw", "request": i, "end_s": e, "latency_s": lat} for i, (e, lat) in
           enumerate([(1.0, 1.0), (1.5, 0.5), (2.0, 1.0), (3.2, 1.2)])])
LOAD_FIGURES = {"req_per_s": {"kind": "ratio", "stat": "rate", "field": "end_s", "num": {"engine": "ours"},
                              "den": {"engine": "raw"}},
                "p50": {"kind": "ratio", "stat": "median", "field": "latency_s", "num": {"engine": "ours"},
                        "den": {"engine": "raw"}}}


def test_a_rate_ratio_is_requests_over_the_last_end_and_a_tampered_record_fails(tmp_path, capsys):
    path = tmp_path / "load.json"
    write_result(path, LOAD_FIGURES, LOAD, provenance(argv=["bench/load.py"]))
    fig = json.loads(path.read_text())["figures"]["req_per_s"]
    assert (fig["num_value"], fig["den_value"]) == (4 / 4.0, 4 / 3.2)
    assert fig["value"] == pytest.approx(3.2 / 4.0)
    assert _run(tmp_path, capsys)[0] == 0
    # one request of "ours" moved earlier, and the records' digest and count rewritten to match:
    # only the recomputation catches it
    rec = tmp_path / "load.records.jsonl"
    rec.write_text(rec.read_text().replace('"end_s": 4.0', '"end_s": 3.0'))
    _edit(path, lambda d: d["records"].update(sha256=hashlib.sha256(rec.read_bytes()).hexdigest()))
    rc, out = _run(tmp_path, capsys)
    assert rc == 1 and "figure req_per_s.value: stored 0.8" in out and "records.sha256" not in out


def test_a_rate_needs_times_since_a_common_start():
    bad = [*LOAD, {"engine": "raw", "request": 9, "end_s": -1.0, "latency_s": 1.0}]
    with pytest.raises(ResultError, match="stat rate needs times"):
        write_result("/nonexistent/x.json", LOAD_FIGURES, bad, provenance(argv=["x"]))
    with pytest.raises(ResultError, match="stat must be mean, median, rate"):
        write_result("/nonexistent/x.json", {"x": {**LOAD_FIGURES["p50"], "stat": "sum"}}, LOAD, provenance(argv=["x"]))


# five interleaved repetitions of the two servers' load phases: "ours" at 0.8, 0.9, 1.0, 0.85 and
# 0.95 of raw's rate (its last request ends later by that factor)
REPS = [{**r, "rep": k, "end_s": r["end_s"] / f if r["engine"] == "ours" else r["end_s"]}
        for k, f in enumerate([0.8, 0.9, 1.0, 0.85, 0.95])
        for r in [{"engine": e, "request": i, "end_s": float(i + 1), "latency_s": 1.0} for e in ("ours", "raw")
                  for i in range(4)]]


def test_a_ratio_over_repetitions_is_the_median_of_each_repetitions_ratio_with_an_interval(tmp_path, capsys):
    figs = {"req_per_s": {"kind": "ratio_reps", "stat": "rate", "field": "end_s", "by": "rep",
                          "num": {"engine": "ours"}, "den": {"engine": "raw"}}}
    path = tmp_path / "reps.json"
    write_result(path, figs, REPS, provenance(argv=["bench/reps.py"]))
    fig = json.loads(path.read_text())["figures"]["req_per_s"]
    assert fig["n_reps"] == 5 and fig["median"] == pytest.approx(0.9)
    assert (fig["min"], fig["max"]) == (pytest.approx(0.8), pytest.approx(1.0))
    assert 0.8 <= fig["ci_low"] < 0.9 < fig["ci_high"] <= 1.0  # the interval spans the 90% a claim would need
    assert _run(tmp_path, capsys)[0] == 0
    _forge_records(path, lambda recs: [r.update(end_s=r["end_s"] * 0.5) for r in recs
                                       if r["engine"] == "ours" and r["rep"] == 0])
    rc, out = _run(tmp_path, capsys)
    assert rc == 1 and "req_per_s.median" in out  # one repetition twice as fast moves the median
    no_rep = [{k: v for k, v in r.items() if k != "rep"} for r in REPS]
    with pytest.raises(ResultError, match="no repetition field 'rep'"):
        write_result("/nonexistent/x.json", figs, no_rep, provenance(argv=["x"]))


# a speed result: ours and the peer timed in one run (seconds per trial)
TIMES = {"ours": [0.010, 0.012, 0.011, 0.030, 0.009], "peer": [0.10, 0.12, 0.11, 0.13, 0.50]}
SPEED_RECORDS = [{"measure": "create", "arm": arm, "trial": i, "seconds": s}
                 for arm, xs in TIMES.items() for i, s in enumerate(xs)]
SPEED_FIGURES = {
    "ours_median": {"kind": "quantile", "of": {"arm": "ours"}, "field": "seconds", "q": 0.5},
    "ours_p95": {"kind": "quantile", "of": {"arm": "ours"}, "field": "seconds", "q": 0.95},
    "peer_over_ours": {"kind": "ratio", "num": {"arm": "peer"}, "den": {"arm": "ours"}, "field": "seconds",
                       "stat": "median"},
    "p95_peer_over_ours": {"kind": "ratio", "num": {"arm": "peer"}, "den": {"arm": "ours"}, "field": "seconds",
                           "stat": "p95"},
    "overhead": {"kind": "difference", "a": {"arm": "ours"}, "b": {"arm": "peer"}, "field": "seconds",
                 "stat": "median"},
}


def _write_speed(d: Path) -> Path:
    write_result(d / "speed.json", SPEED_FIGURES, SPEED_RECORDS, provenance(argv=["bench/speed.py"]))
    return d / "speed.json"


def _forge_records(path: Path, fn) -> None:
    """Edit the records and update their digest and count too (a consistent forgery): only the
    figures recomputed from them can then catch it."""
    import hashlib

    rec = path.with_name(path.name.removesuffix(".json") + ".records.jsonl")
    rows = [json.loads(ln) for ln in rec.read_text().splitlines()]
    fn(rows)
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    rec.write_text(text)
    _edit(path, lambda d: d["records"].update(sha256=hashlib.sha256(text.encode()).hexdigest(), count=len(rows)))


def test_speed_figures_give_both_medians_their_ratio_difference_and_percentiles(tmp_path, capsys):
    figs = json.loads(_write_speed(tmp_path).read_text())["figures"]
    assert figs["ours_median"]["value"] == pytest.approx(0.011) and figs["ours_median"]["n"] == 5
    assert figs["ours_p95"]["value"] == pytest.approx(float(np.percentile(TIMES["ours"], 95)))
    r = figs["peer_over_ours"]
    assert (r["num_value"], r["den_value"], r["value"]) == pytest.approx((0.12, 0.011, 0.12 / 0.011))
    assert figs["p95_peer_over_ours"]["value"] == pytest.approx(
        np.percentile(TIMES["peer"], 95) / np.percentile(TIMES["ours"], 95))
    assert figs["overhead"]["value"] == pytest.approx(0.12 - 0.011)
    assert _run(tmp_path, capsys)[0] == 0


@pytest.mark.parametrize(("figure", "field"), [
    ("ours_median", "value"), ("ours_p95", "value"), ("peer_over_ours", "value"), ("p95_peer_over_ours", "value"),
    ("overhead", "value"),
])
def test_a_tampered_speed_record_fails_the_figures_computed_from_it(tmp_path, capsys, figure, field):
    path = _write_speed(tmp_path)

    def faster(rows):  # ours made faster: its median and p95 move, and so does every ratio/difference
        for r in rows:
            if r["arm"] == "ours":
                r["seconds"] /= 2

    _forge_records(path, faster)
    rc, out = _run(tmp_path, capsys)
    assert rc == 1 and "records.sha256" not in out
    assert f"figure {figure}.{field}: stored" in out


@pytest.mark.parametrize("bad", [{"stat": "p101"}, {"stat": "max"}, {"stat": "pxx"}])
def test_an_unknown_stat_is_refused(tmp_path, bad):
    with pytest.raises(ResultError, match="stat must be mean, median, rate or pNN"):
        write_result(tmp_path / "x.json", {"r": {**SPEED_FIGURES["peer_over_ours"], **bad}}, SPEED_RECORDS,
                     provenance(argv=["x"]))
    with pytest.raises(ResultError, match="q must be a number"):
        write_result(tmp_path / "x.json", {"q": {**SPEED_FIGURES["ours_p95"], "q": 95}}, SPEED_RECORDS,
                     provenance(argv=["x"]))


def _ab_rows() -> list[dict]:
    """Per-user rows of one canary metric: 12 users an arm, the treatment keeping more changes."""
    rows = []
    for i in range(24):
        arm = "treatment" if i % 2 else "control"
        kept = (i * 7) % 5 + (2 if arm == "treatment" else 0)
        rows.append({"kind": "ab", "user_id": f"u{i}", "arm": arm, "metric": "accept_rate", "numerator": kept,
                     "denominator": 8, "ts": 100.0 + i})
    return rows


def test_an_ab_figure_is_the_readout_recomputed_and_an_edited_lift_fails(tmp_path, capsys):
    rows = _ab_rows()
    fig = {"kind": "ab", "of": {"kind": "ab"}, "metric": "accept_rate", "alpha": 0.05, "weights": [0.5, 0.5], "mde": 0.2}
    path = tmp_path / "ab.json"
    write_result(path, {"lift": fig}, rows, provenance(argv=["bench/probe.py"]))
    got = json.loads(path.read_text())["figures"]["lift"]
    want = analyze_metric(rows, "accept_rate", ABConfig(alpha=0.05, weights=(0.5, 0.5), mde=0.2))
    assert (got["users_control"], got["users_treatment"]) == (12, 12)
    for k in ("control", "treatment", "delta", "ci_low", "ci_high", "p_value", "msprt_p", "msprt_ci_low"):
        assert got[k] == pytest.approx(want[k]), k
    assert got["delta"] > 0 and got["ci_low"] < got["delta"] < got["ci_high"]
    assert _run(tmp_path, capsys)[0] == 0
    _edit(path, lambda d: d["figures"]["lift"].update(delta=round(got["delta"] + 0.05, 4)))
    rc, out = _run(tmp_path, capsys)
    assert rc == 1 and "figure lift.delta: stored" in out


def test_an_ab_figure_needs_per_user_rows(tmp_path):
    with pytest.raises(ResultError, match=r"no field 'user_id' \(ab needs user_id, arm, metric, numerator, denominator\)"):
        write_result(tmp_path / "x.json", {"lift": {"kind": "ab", "of": {"arm": "base"}, "metric": "resolved"}},
                     RECORDS, provenance(argv=["x"]))


def _edit(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("forge", [
    lambda d: d.update(true_promotions_claimed=1),  # a top-level claim beside the figures
    lambda d: d["meta"].update(headline="the loop promoted a better model"),  # a free-text claim in meta
    lambda d: d["meta"].update(cycle={"promotion_claimed": True}),
    lambda d: d["provenance"].update(git_commit="0" * 40),  # a commit that is no commit
])
def test_a_forged_claim_or_commit_fails_verify(tmp_path, forge):
    """Evidence round two: verify checked only `figures`; a top-level `true_promotions_claimed`,
    a `meta.headline` and a commit of forty zeros all verified."""
    path = _write(tmp_path)
    assert verify.main(["--results", str(tmp_path)]) == 0
    _edit(path, forge)
    assert verify.main(["--results", str(tmp_path)]) == 1


def test_a_reward_term_named_like_a_claim_is_a_weight_not_a_claim(tmp_path):
    """`unsupported_claims` is a reward term: the weights a cycle ran with name it."""
    path = _write(tmp_path)
    _edit(path, lambda d: d["meta"].update(config={"weights": {"unsupported_claims": 1.0}},
                                           distill_weights={"unsupported_claims": 1.0}))
    assert verify.main(["--results", str(tmp_path)]) == 0
    _edit(path, lambda d: d["meta"].update(config={"weights": {"x": 1.0}, "unsupported_claims": 1.0}))
    assert verify.main(["--results", str(tmp_path)]) == 1


def test_a_commit_missing_from_the_repository_fails_verify(tmp_path):
    import subprocess

    repo = tmp_path / "repo"
    (repo / "results").mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    path = _write(repo / "results")
    _edit(path, lambda d: d["provenance"].update(git_commit=head))
    assert verify.main(["--results", str(repo / "results")]) == 0
    _edit(path, lambda d: d["provenance"].update(git_commit="1234567" + head[7:][::-1]))
    assert verify.main(["--results", str(repo / "results")]) == 1


def test_every_result_files_script_declares_what_its_meta_may_hold():
    from etude.evals.results import PROJECT, declared_schema, script_of

    for path in sorted((BENCH_DIR / "results").glob("*.json")):
        script = script_of(json.loads(path.read_text())["provenance"]["command"])
        assert script and declared_schema(PROJECT / script), f"{path.name}: {script} declares no META_SCHEMA"


def test_a_meta_field_its_script_does_not_declare_fails_verify(tmp_path):
    import shutil

    src = BENCH_DIR / "results" / "rl_memory.json"
    for p in (src, src.with_name("rl_memory.records.jsonl")):
        shutil.copy(p, tmp_path / p.name)
    assert verify.main(["--results", str(tmp_path)]) == 0
    _edit(tmp_path / "rl_memory.json", lambda d: d["meta"].update(promotions=2))
    assert verify.main(["--results", str(tmp_path)]) == 1
    _edit(tmp_path / "rl_memory.json", lambda d: (d["meta"].pop("promotions"), d["meta"].update(steps="many")))
    assert verify.main(["--results", str(tmp_path)]) == 1
