"""Divergences planted on purpose, for the tests that check the locator finds them."""

from __future__ import annotations

import torch

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


def norm_nudged_in_whole_prefill(monkeypatch, prompt_len: int, layer: int, row: int, element: int) -> None:
    """A prefill forward of exactly `prompt_len` rows (the whole prompt at once, not in chunks)
    moves layer `layer`'s attention-norm output at (`row`, `element`) one float32 step up. The
    keys and values that row writes into the KV cache change; whether the prefill's own sampled
    logprob changes is a matter of rounding (for the tests' choice it does not, a later decode
    step's does: the difference reaches the output only through the cache)."""
    from lockstep.engine import model

    def planted(self, x, step):
        h = self.ops.rms_norm(x, self.norm, self.eps, self.act)
        if self.layer == layer and h.shape[0] == prompt_len:
            h = h.clone()
            h[row, element] = torch.nextafter(h[row, element], torch.tensor(float("inf"), dtype=h.dtype))
        h = self.record(self.name + "attn_norm", h)
        if self.ops.fused is not None:
            return self.fused(x, h, step)
        return model.residual(x, self.attend(h, step), self.act)

    monkeypatch.setattr(model.AttentionBlock, "__call__", planted)
