"""An independent, byte-oriented MurmurHash3_x86_32 in plain Python (Austin Appleby's algorithm).

Written from the algorithm's description, over arbitrary byte strings, with no code shared
with kernels/coins.py; the tests compare both kernels against it on random keys.
"""

import struct


def murmur3_x86_32(data: bytes, seed: int = 0) -> int:
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed & mask
    nblocks = len(data) // 4
    for (k,) in struct.iter_unpack("<I", data[: nblocks * 4]):
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    tail = data[nblocks * 4:]
    if tail:
        k = int.from_bytes(tail, "little")
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h


def lockstep_key_hash(seed: int, pos: int, col: int) -> int:
    """DESIGN §5: the key is seed as uint64 ‖ pos as uint32 ‖ col as uint32, little-endian."""
    key = struct.pack("<QII", seed % 2**64, pos % 2**32, col % 2**32)
    return murmur3_x86_32(key, 0)


if __name__ == "__main__":  # print hashes of keys given as 'seed,pos,col' arguments
    import sys

    for arg in sys.argv[1:]:
        s, p, c = (int(x, 0) for x in arg.split(","))
        print(f"{arg} -> {lockstep_key_hash(s, p, c)}")
