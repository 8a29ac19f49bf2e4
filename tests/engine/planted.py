"""Divergences planted on purpose, for the tests that check the locator finds them."""

from __future__ import annotations

import lockstep.kernels.attention

PLANTED_TILE = 4        # key positions per tile in one-row forward calls (the engine's is KV_TILE = 32)


def different_tile_when_alone(monkeypatch) -> None:
    """A forward of one row (a decode step of a request decoding alone) walks the keys in tiles of
    PLANTED_TILE instead of lockstep.kernels.attention.KV_TILE: the tile sums are added in another order,
    so that step's attention output changes in its low bits, and only there (D2 broken). Planted
    in the torch ops' attention (lockstep.kernels.attention._attend, which reads KV_TILE per call)."""
    attend = lockstep.kernels.attention._attend

    def planted(q, *args, **kwargs):
        if q.shape[0] != 1:
            return attend(q, *args, **kwargs)
        tile = lockstep.kernels.attention.KV_TILE
        lockstep.kernels.attention.KV_TILE = PLANTED_TILE
        try:
            return attend(q, *args, **kwargs)
        finally:
            lockstep.kernels.attention.KV_TILE = tile

    monkeypatch.setattr(lockstep.kernels.attention, "_attend", planted)
