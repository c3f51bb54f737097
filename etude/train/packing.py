"""First-fit-decreasing packing of token runs into rows, the one packer of the RL learner
(`learner.pack`, whose units are samples, GRPO groups or episode chains) and SFT
(`sft_tokens.pack_rows`, whose units are sequences)."""

from __future__ import annotations

from collections.abc import Sequence


def first_fit_decreasing(units: Sequence[tuple[int, Sequence[int]]], budget: int) -> list[list[int]]:
    """`units` are (cost in tokens, the indices they hold); returns rows of indices whose units
    cost ≤ `budget` together. Longest first (ties keep their order), each into the first row with
    room; a unit over budget gets a row of its own."""
    order = sorted(units, key=lambda u: -u[0])
    rows: list[list[int]] = []
    room: list[int] = []
    for n, members in order:
        for r, free in enumerate(room):
            if n <= free:
                rows[r].extend(members)
                room[r] -= n
                break
        else:
            rows.append(list(members))
            room.append(budget - n)
    return rows
