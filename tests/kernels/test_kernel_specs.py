"""specs/kernels/*.yaml through the `kernel` spec kind: every spec loads and its expectations
hold on this platform; putting back the empty-tile bug or a tail bug turns specs red, with a
report that names the kernel and the shape. (Goldens are the owner's: `lockstep regen`.)"""

import functools
from pathlib import Path

import pytest

import lockstep.harness.kinds as kinds
from lockstep.harness.kinds import kernel as kernel_kind
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from lockstep.harness.specfile import load_specs
from tests.kernels.conftest import DEVICE
from lockstep.harness.targets.lockstep import engine

SPECS = Path(__file__).resolve().parents[2] / "specs"


@pytest.fixture(scope="module")
def kernel_specs():
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(kinds.KINDS, "kernel", kernel_kind)      # until the owner registers the kind
        specs, errors = load_specs(SPECS)
    assert not [e for e in errors if "kernels/" in str(e)], errors
    return {s.id: s for s in specs if s.kind == "kernel"}


def platform():
    return detect(DEVICE.type)          # the runner makes its inputs on the platform's device


def check(spec):
    ctx = RunContext(platform=platform())
    return kernel_kind.check(spec, kernel_kind.run(spec, ctx, engine(ctx)))


def test_there_are_enough_specs(kernel_specs):
    assert len(kernel_specs) >= 25
    kernels = {s.inputs["kernel"] for s in kernel_specs.values()}
    assert kernels == set(kernel_kind.cases())
    assert kernel_kind.golden_platform(next(iter(kernel_specs.values())), RunContext(platform=platform())).endswith("-triton")


# That each spec's expectations hold is not tested here: every spec is a pytest item of its own
# (pyproject testpaths: specs), and the item fails unless `runner.check_spec` passes, which checks
# the expectations before the golden. (Ten of them were re-run here: docs/gate.md.)


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_the_empty_tile_bug_turns_specs_red(kernel_specs, monkeypatch):
    import lockstep.kernels.attention as A
    monkeypatch.setattr(A, "attention_triton", functools.partial(A.attention_triton, _guard=False))
    fails = check(kernel_specs["kernels/attention-empty-tiles-window-128"])
    assert fails and "kernel attention [Hq=8, Hkv=1, D=64, S=576, window=128]" in fails[0]
    assert any("non-finite" in f for f in fails)


def test_a_tail_bug_turns_specs_red(kernel_specs, monkeypatch):
    """An unmasked K tail (the loop drops the last partial chunk) must fail the tail specs."""
    import lockstep.kernels.matmul as M
    real = M.linear_triton

    def no_tail(x, w, b=None):
        bk = M.TILES[2]
        k = x.shape[1] // bk * bk or x.shape[1]
        return real(x[:, :k].contiguous(), w[:, :k].contiguous(), b)

    monkeypatch.setattr(M, "linear_triton", no_tail)
    fails = check(kernel_specs["kernels/matmul-n127-k129"])
    assert fails and fails[0].startswith("lockstep: kernel matmul [M=17, K=129, N=127] fp32: max |lockstep - reference|")


def test_a_grouping_bug_turns_the_grouped_expert_specs_red(kernel_specs, monkeypatch):
    """The engine's grouped experts with a grouping that loses the last expert's last row (a block
    tail dropped) must fail the block-tail spec, named by kernel and shape."""
    import lockstep.engine.experts as X
    real = X.group_by_expert

    def drops_a_tail_row(flat_ids, *args):
        rows, blocks = real(flat_ids, *args)
        rows = rows.clone()
        rows[(rows >= 0).nonzero()[-1]] = -1
        return rows, blocks

    monkeypatch.setattr(X, "group_by_expert", drops_a_tail_row)
    fails = check(kernel_specs["kernels/experts-block-tails"])
    assert fails and fails[0].startswith("lockstep: kernel experts [T=7, H=72, E=4, k=3, I=40] fp32: max |lockstep - reference|")
