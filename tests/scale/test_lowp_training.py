"""Emulated MXFP8 training of a tiny causal LM tracks the bf16 reference."""

import pytest

from etude.scale.lowp_train import train_curve

# Stated tolerance (docs/scale.md): the mean loss over the last 10 steps is within 5% of bf16.
TOLERANCE = 0.05


@pytest.mark.slow
def test_mxfp8_loss_tracks_bf16():
    ref = train_curve("bf16", steps=40)
    mx = train_curve("mxfp8", steps=40)
    assert ref[-1] < ref[0] * 0.8  # the reference learns at all
    tail = lambda c: sum(c[-10:]) / 10  # noqa: E731
    assert abs(tail(mx) - tail(ref)) / tail(ref) < TOLERANCE, (tail(mx), tail(ref))
