"""MetricsWriter keeps each step once across resumes."""


from etude.train.metrics import MetricsWriter, read_metrics


def _fill(tmp_path, steps):
    w = MetricsWriter(tmp_path, resume_step=-1, tensorboard=False)
    for s in steps:
        w.write({"kind": "train", "step": s})
    w.close()


def test_resume_drops_records_after_the_checkpoint_and_a_torn_line(tmp_path):
    _fill(tmp_path, [0, 1, 2, 3])
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"kind": "tra')  # killed mid-write
    w = MetricsWriter(tmp_path, resume_step=2, tensorboard=False)
    w.write({"kind": "train", "step": 3})
    w.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]


def test_fresh_run_drops_everything(tmp_path):
    _fill(tmp_path, [0, 1])
    MetricsWriter(tmp_path, resume_step=-1, tensorboard=False).close()
    assert read_metrics(tmp_path) == []
