"""A prefix cache: reuse the KV of a prompt prefix that an earlier request already computed.

    cache = PrefixCache(block=16)
    generate(model, [Request(prompt=a)], prefix_cache=cache)         # cold: a's KV is stored
    generate(model, [Request(prompt=a + b)], prefix_cache=cache)     # hit: a's KV is copied, b prefilled
    cache.hits, cache.hit_tokens                                      # how many lookups reused something

The key and value at position p depend only on the tokens 0..p (causal attention) and every
row is computed alone (DESIGN §2, D2), so the KV an earlier request wrote for a shared prefix is
bit for bit the KV a cold prefill would write: a hit may reuse it (D3). What is stored is each
prompt's KV in blocks of `block` positions, keyed by the hash of every token up to the block's
end (a chain: a block is found only under its whole prefix). A lookup walks the chain of full
blocks, then reuses the leading positions of one more stored block whose tokens agree with the
prompt's (a partial-block hit). At least the prompt's last token is always left to compute, since
its logits are needed.

generate() calls `lookup` before its prefill (the hit's KV goes into the request's slot and the
prefill starts after it) and `store` after it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import torch

from lockstep.engine.kv_cache import KVCache


@dataclass
class _Block:
    tokens: tuple[int, ...]            # the block's own tokens (positions [start, start + len))
    k: list[torch.Tensor]              # per layer [kv_heads, len, D]
    v: list[torch.Tensor]


def _chain(prev: str, tokens: Sequence[int]) -> str:
    return hashlib.sha256((prev + ":" + ",".join(map(str, tokens))).encode()).hexdigest()


class PrefixCache:
    """Prompt KV in blocks of `block` positions (see the module docstring)."""

    def __init__(self, block: int = 16):
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"PrefixCache.block: must be an int >= 1, got {block!r}")
        self.block = block
        self._blocks: dict[str, _Block] = {}          # chain key of the prefix before the block + its tokens
        self._children: dict[str, list[str]] = {}     # chain key of a prefix -> keys of the blocks after it
        self.lookups = 0
        self.hits = 0                                  # lookups that reused at least one position
        self.hit_tokens = 0                            # positions reused, over all lookups

    def lookup(self, prompt: Sequence[int], kv: KVCache, slot: int) -> int:
        """Copy the KV of the longest cached prefix of `prompt` (at most len - 1 positions) into
        `slot` of `kv`; -> the number of positions copied (0: a miss)."""
        self.lookups += 1
        limit = len(prompt) - 1
        prev, n = "", 0
        while True:
            key = self._find_next(prev, prompt, n, limit)
            if key is None:
                break
            blk = self._blocks[key]
            take = min(len(blk.tokens), limit - n)
            full = take == self.block and tuple(prompt[n:n + take]) == blk.tokens
            if not full:                                        # a partial block: its agreeing head
                take = _common(blk.tokens, prompt[n:limit])
            self._copy(blk, kv, slot, n, take)
            n += take
            if not full:
                break
            prev = _chain(prev, blk.tokens)
        if n:
            self.hits += 1
            self.hit_tokens += n
        return n

    def _find_next(self, prev: str, prompt: Sequence[int], n: int, limit: int) -> str | None:
        """The stored block after prefix `prev` that shares the most leading tokens with prompt[n:]."""
        best, best_len = None, 0
        for key in self._children.get(prev, ()):
            m = _common(self._blocks[key].tokens, prompt[n:limit])
            if m > best_len:
                best, best_len = key, m
        return best

    def _copy(self, blk: _Block, kv: KVCache, slot: int, start: int, n: int) -> None:
        for layer in range(len(kv.k)):
            kv.k[layer][slot, :, start:start + n] = blk.k[layer][:, :n]
            kv.v[layer][slot, :, start:start + n] = blk.v[layer][:, :n]

    def store(self, prompt: Sequence[int], kv: KVCache, slot: int) -> None:
        """Keep the KV of every block of `prompt` (the last one may be short), read from `slot`."""
        prev = ""
        for start in range(0, len(prompt), self.block):
            tokens = tuple(prompt[start:start + self.block])
            key = _chain(prev, tokens)
            if key not in self._blocks:
                self._blocks[key] = _Block(tokens, [kv.k[layer][slot, :, start:start + len(tokens)].clone()
                                                    for layer in range(len(kv.k))],
                                           [kv.v[layer][slot, :, start:start + len(tokens)].clone()
                                            for layer in range(len(kv.v))])
                self._children.setdefault(prev, []).append(key)
            if len(tokens) < self.block:
                break
            prev = _chain(prev, tokens)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
