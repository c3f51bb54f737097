"""etude.pipeline.isolate.in_child: a training stage in its own process, its memory gone after."""

import os

import psutil
import pytest

from etude.errors import EtudeError
from etude.pipeline.isolate import in_child
from tests.pipeline import isolate_fns as f


def test_the_result_comes_back_and_the_memory_stays_in_the_child():
    before = psutil.Process().memory_info().rss
    out = in_child(f.hold_memory, 300)
    assert out["pid"] != os.getpid() and out["peak_mib"] >= 300  # the child held it
    assert psutil.Process().memory_info().rss - before < 100 * 2**20  # this process never did


def test_errors_come_back_as_the_operator_should_see_them():
    with pytest.raises(EtudeError, match="^no such base model$"):
        in_child(f.refuse, "no such base model")
    with pytest.raises(RuntimeError, match="KeyError: 'missing'"):
        in_child(f.crash)  # the child's traceback is in the message
    with pytest.raises(EtudeError, match="exited with code 3 before it finished"):
        in_child(f.die, 3)
