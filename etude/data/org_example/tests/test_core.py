from mini.core import clamp, count_pos, last, scale, span, total


def test_clamp():
    assert clamp(-5, 0, 10) == 0
    assert clamp(50, 0, 10) == 10
    assert clamp(5, 0, 10) == 5


def test_total():
    assert total([1, 2, 3]) == 6


def test_count_pos():
    assert count_pos([1, -2, 3, 0]) == 2


def test_scale():
    assert scale([1, 2], 3) == [3, 6]


def test_last():
    assert last([1, 2], 0) == 2
    assert last([], 7) == 7


def test_span():
    assert span([3, 9, 4]) == 6
