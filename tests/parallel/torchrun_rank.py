"""What tests/parallel/test_torchrun.py starts under torchrun: every process joins torchrun's world
(engine.world); rank 0 generates at TP = the world's size over it and prints whether the bits equal
the one-device model's; the others serve. `planted`: every rank adds its o_proj / down partials in
a wrong order (tests/parallel/wrong_orders.one_rank_sequential) before it joins."""

from __future__ import annotations

import json
import sys

from lockstep.engine import parallel, world
from lockstep.engine.generate import generate
from lockstep.engine.model import GptOssModel

from tests.parallel import scenarios, wrong_orders


def main(ckpt: str, mode: str) -> int:
    if mode == "planted":
        parallel.reduce_row_parallel = wrong_orders.one_rank_sequential
    rank, size = world.join()
    if rank != 0:
        return world.serve()
    try:
        want = scenarios.bits(generate(GptOssModel.from_checkpoint(ckpt), scenarios.requests(), capture=scenarios.CAPTURE))
        got = parallel.generate_at(ckpt, size, 1, scenarios.requests(), capture=scenarios.CAPTURE)
        print(json.dumps({"world": size, "same": scenarios.bits(got) == want}))
    finally:
        world.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
