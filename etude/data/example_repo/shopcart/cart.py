"""Cart arithmetic."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    name: str
    price: float
    qty: int = 1


def subtotal(items: list[Item]) -> float:
    """Sum of price times quantity."""
    return sum(item.price * item.qty for item in items)


def total(items: list[Item], discount: float = 0.0) -> float:
    """Subtotal after a fractional discount (0.1 means 10% off), rounded to cents."""
    if not 0.0 <= discount <= 1.0:
        raise ValueError("discount must be between 0 and 1")
    return round(subtotal(items) - discount, 2)
