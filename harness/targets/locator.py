"""The layer locator for another engine: in which block a forward divergence starts, from the
boundary states (DESIGN §3) the engine captures and the reference's on the same tokens.

Each boundary b (0: the embedding, b: after block b - 1) is compared over every position as
rel_b = max |Δ| / max |reference|. Two correct implementations drift slowly through the blocks; a
convention error moves its block's output by orders of magnitude more. The first boundary whose
rel_b exceeds the dtype's floor and JUMP times every boundary before it names the block. It is a
locator, never a verdict: it adds where to the cause the calibrated judge already found, and where
no boundary jumps it says so (the final norm, the head or the logprob computation remain).
"""

from __future__ import annotations

import torch

JUMP = 10.0
# rel_b below this is the dtype's own drift (fp32 implementations agree to ~1e-6 of a state's
# scale, bf16 ones to ~1e-2); a convention error in one block moves it to 1e-1 or more.
FLOOR = {"fp32": 1e-4, "bf16": 0.1}


def relative_errors(got: torch.Tensor, ref: torch.Tensor, boundaries: int) -> list[float]:
    """rel_b for each boundary of two [T, boundaries * H] captures."""
    H = ref.shape[1] // boundaries
    out = []
    for b in range(boundaries):
        r, g = ref[:, b * H:(b + 1) * H].double(), got[:, b * H:(b + 1) * H].double()
        scale = float(r.abs().max())
        out.append(float((g - r).abs().max().nan_to_num(nan=float("inf"))) / (scale if scale > 0 else 1.0))
    return out


def first_jump(rel: list[float], dtype: str) -> int | None:
    """The first boundary that stands out from its dtype's drift and from every boundary before it."""
    floor = FLOOR.get(dtype, FLOOR["bf16"])
    for b, e in enumerate(rel):
        if e > floor and e > JUMP * max(rel[:b], default=0.0):
            return b
    return None


def where(rel: list[float], dtype: str) -> str:
    """'block N' (or 'the embedding'), or the phrase saying no boundary stands out."""
    b = first_jump(rel, dtype)
    if b is None:
        return "no block: every boundary state within its drift (the final norm, the head or the logprobs)"
    return "the embedding" if b == 0 else f"block {b - 1}"


def locate(capture, reference_capture, checkpoint, tokens: list[int], layers: int, dtype: str) -> tuple[str, str]:
    """(where the engine's boundary states first leave the reference's on `tokens`, a note with
    every boundary's rel_b: the evidence)."""
    boundaries = list(range(layers + 1))
    got = torch.as_tensor(capture(checkpoint, tokens, boundaries)).float()
    ref = torch.as_tensor(reference_capture(checkpoint, tokens, boundaries)).float()
    if got.shape != ref.shape:
        return "unlocated", (f"layer locator: the engine's capture is {tuple(got.shape)}, the reference's "
                             f"{tuple(ref.shape)}")
    rel = relative_errors(got, ref, len(boundaries))
    shown = ", ".join(f"b{b} {e:.2g}" for b, e in enumerate(rel))
    at = where(rel, dtype)
    return at.split(":")[0], (f"layer locator: {at} (boundary states vs the reference on the same {len(tokens)} "
                              f"tokens, max |Δ| / max |state|: {shown})")
