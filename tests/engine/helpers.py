"""Small helpers shared by the engine tests."""

from __future__ import annotations

import torch


def random_prompt(n: int, seed: int, vocab: int = 500) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def prefill(model, prompt, capacity=None, capture=()):
    """One full prefill of `prompt` into a fresh cache -> ForwardOutput."""
    T = len(prompt)
    cache = model.new_cache(1, capacity or T)
    return model.forward(torch.tensor(prompt), torch.arange(T), torch.zeros(T, dtype=torch.int64),
                         cache, capture=capture)
