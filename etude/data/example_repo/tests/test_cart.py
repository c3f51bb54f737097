import pytest
from shopcart import Item, subtotal, total

ITEMS = [Item("pen", 1.50, 4), Item("notebook", 4.00)]


def test_subtotal():
    assert subtotal(ITEMS) == 10.0


def test_total_without_discount():
    assert total(ITEMS) == 10.0


def test_total_with_discount():
    assert total(ITEMS, discount=0.1) == 9.0


def test_discount_out_of_range():
    with pytest.raises(ValueError):
        total(ITEMS, discount=1.5)
