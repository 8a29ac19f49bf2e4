"""EAGLE3 aux layer ids -> hidden-state boundaries of the target (DESIGN §3).

A target with L blocks has boundaries 0..L: boundary 0 is the embedding output, boundary
i + 1 the output of block i (before the final norm). A draft config lists
`eagle_aux_hidden_state_layer_ids`, whose meaning depends on the stack that trained it:

    convention     ids -> boundaries
    boundary       as-is                                                   (vLLM)
    sglang         as-is if the list is non-empty and max(ids) == L,
                   else each id + 1                                        (SGLang after its fix)
    output-index   each id + 1 (id = the 0-based block whose output is taken) (TRT-LLM, ModelOpt)

With no ids, every convention gives [2, L // 2, L - 3]. The result must lie in [0, L], hold
no duplicates, and have exactly the draft's expected number of aux states; otherwise a
LayerIdError names the config, the convention, the ids, the resolved boundaries and L.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

CONVENTIONS = ("boundary", "sglang", "output-index")


class LayerIdError(ValueError):
    pass


class CaptureError(RuntimeError):
    """A forward was asked for a boundary that its capture loop never recorded: the capture
    contract of DESIGN §3 is broken (e.g. states recorded "before block i", which never sees L)."""


def gather_captured(states: dict[int, torch.Tensor], capture: Sequence[int], num_layers: int
                    ) -> torch.Tensor | None:
    """The requested boundary states concatenated in the order asked, [T, len(capture) * H], or
    None for no capture. A requested boundary missing from `states` is a CaptureError naming it."""
    if not capture:
        return None
    missing = [b for b in capture if b not in states]
    if missing:
        what = f"boundary {missing[0]} was" if len(missing) == 1 else f"boundaries {missing} were"
        raise CaptureError(f"{what} requested and never captured (requested {list(capture)}, captured "
                           f"{sorted(states)}, L = {num_layers}): boundary 0 is the embedding output, "
                           "captured before the first block, and boundary i + 1 is captured after block i "
                           "(DESIGN §3)")
    return torch.cat([states[b] for b in capture], dim=-1)


def default_boundaries(num_layers: int) -> list[int]:
    return [2, num_layers // 2, num_layers - 3]


def resolve_boundaries(ids: Sequence[int] | None, convention: str, num_layers: int,
                       expected_count: int, config_name: str) -> list[int]:
    """Boundaries to capture, in the order of `ids` (see the module docstring)."""
    L = num_layers
    ids_list = list(ids) if ids else []

    def fail(why: str, resolved) -> LayerIdError:
        return LayerIdError(f"{config_name}: eagle_aux_hidden_state_layer_ids={ids_list} under convention "
                            f"{convention!r} resolve to boundaries {resolved} for a target with L={L} blocks: "
                            f"{why}")

    if convention not in CONVENTIONS:
        raise fail(f"unknown convention (known: {', '.join(CONVENTIONS)})", None)
    if isinstance(L, bool) or not isinstance(L, int) or L < 1:
        raise fail("num_layers must be a positive int", None)
    for i in ids_list:
        if isinstance(i, bool) or not isinstance(i, int):
            raise fail(f"id {i!r} is not an int", None)

    if not ids_list:
        resolved = default_boundaries(L)
    elif convention == "boundary":
        resolved = list(ids_list)
    elif convention == "sglang":
        resolved = list(ids_list) if max(ids_list) == L else [i + 1 for i in ids_list]
    else:  # output-index
        resolved = [i + 1 for i in ids_list]

    out_of_range = [b for b in resolved if not 0 <= b <= L]
    if out_of_range:
        raise fail(f"boundaries {out_of_range} are outside [0, {L}]", resolved)
    dups = sorted({b for b in resolved if resolved.count(b) > 1})
    if dups:
        raise fail(f"boundaries {dups} appear more than once", resolved)
    if len(resolved) != expected_count:
        raise fail(f"the draft expects {expected_count} aux states (fc input width / target hidden size), "
                   f"got {len(resolved)}", resolved)
    return resolved


def aux_layer_ids_from_draft_config(draft_config: dict[str, Any]) -> list[int] | None:
    """`eagle_aux_hidden_state_layer_ids` from `eagle_config` or the top level (DESIGN §3). Equal ids
    in both places are fine; different ones are an error naming both, since engines disagree on
    which place they read (SGLang reads eagle_config only, vLLM's default runner the top level)."""
    found = []
    for where, source in (("eagle_config", draft_config.get("eagle_config") or {}), ("the top level", draft_config)):
        ids = source.get("eagle_aux_hidden_state_layer_ids")
        if ids is not None:
            if not isinstance(ids, (list, tuple)):
                raise LayerIdError(f"eagle_aux_hidden_state_layer_ids must be a list, got {ids!r}")
            found.append((where, list(ids)))
    if len(found) == 2 and found[0][1] != found[1][1]:
        raise LayerIdError(f"eagle_aux_hidden_state_layer_ids differ: {found[0][1]} in eagle_config, {found[1][1]} at "
                           "the top level (engines disagree on which one they read); make them equal or keep one")
    return found[0][1] if found else None
