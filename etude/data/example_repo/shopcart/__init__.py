"""A tiny shopping cart: items, a subtotal, and a total after a fractional discount."""

from shopcart.cart import Item, subtotal, total

__all__ = ["Item", "subtotal", "total"]
