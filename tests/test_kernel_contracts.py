"""DESIGN §8, every edge case in every place the engine computes it: take the guard out (of the
kernel's own source, or by swapping in the function with the bug) and a spec that `lockstep check`
runs by default turns red.

    edge case        where                                          spec that turns red
    empty tile       kernels/attention.py torch ops' attention      generate/greedy-tiny-bf16
                     kernels/attention.py Triton kernel             kernels/attention-empty-tiles-window-128,
                                                                    kernels/attention-prefill-256-window-128,
                                                                    kernels/attention-splits-window-128, -961
                     kernels/attention.py split-K window start      kernels/attention-splits-window-961
                     kernels/attention.py torch reference           kernels/attention-all-masked-no-sink (new)
                     kernels/attention.py sink merge (Triton)       kernels/attention-all-masked-no-sink (new)
    N / K tails      kernels/matmul.py (K loop, N store mask)       kernels/matmul-n127-k129, -tail-2880, -n1-k1
                     kernels/rmsnorm.py (sum of squares)            kernels/rmsnorm-n127, -n2881
                     kernels/matmul.py `_chunk_acc` (K loop) in     kernels/experts-block-tails
                     kernels/moe.py's grouped expert kernels
    top-k ties       kernels/moe.py router top-k (torch ops)        generate/router-ties, kernels/router-top4-ties
                     engine/parallel.py router top-k (TP/EP ranks)  generate/router-ties, its TP 2 / EP 2 runs
                                                                    (checked by editing the file: ranks are
                                                                    fresh processes a monkeypatch cannot reach)
                     kernels/moe.py Triton router (triton backend)  kernels/router-top4-ties
                     kernels/moe.py torch reference                 kernels/router-top4-ties
                     engine/speculative.py draft top-k              draft/top-k-ties (tests/speculative/test_draft_specs.py)
    Gumbel ends      kernels/coins.py (engine sampling, torch)      coins/gumbel-endpoints, generate/gumbel-endpoints
                     kernels/sampling.py Triton sampler             kernels/sampling-gumbel-endpoints

The engine's Triton backend calls the same Triton kernels (attention, router top-k, RMSNorm,
matmul); its engine specs take minutes each in Triton's interpreter, so that path is pinned here
through the kernel specs. Engine-platform goldens come from a clean run in this process
(tests/planted.py), so a verdict never depends on this machine's bits matching the repository's.
"""

import pytest
import torch

import lockstep.engine.model
import lockstep.kernels.attention
import lockstep.kernels.coins
import lockstep.kernels.matmul
import lockstep.kernels.moe
import lockstep.kernels.moe_router
import lockstep.kernels.rmsnorm
import lockstep.kernels.sampling
from lockstep.kernels.attention import KV_TILE
from tests.planted import Planted, module_with

# one xdist worker runs the module (pyproject --dist loadgroup): its clean recordings (tests/planted.py) once a run
pytestmark = pytest.mark.xdist_group("kernel-contracts")
ENGINE_SPECS = ["generate/greedy-tiny-bf16", "generate/router-ties", "generate/gumbel-endpoints"]


@pytest.fixture(scope="module")
def engine_specs(tmp_path_factory):
    return Planted(tmp_path_factory.mktemp("engine"), ENGINE_SPECS)


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory):
    return Planted(tmp_path_factory.mktemp("kernels"), [])     # kernel goldens: the repository's own


@pytest.fixture
def plant(tmp_path, monkeypatch):
    """plant(module, {old: new}, *names): the module's kernels `names` rebuilt from its source with
    the guard taken out, swapped in for the rest of the test."""
    def put_back(module, replacements, *names):
        buggy = module_with(module, replacements, tmp_path)
        for name in names:
            monkeypatch.setattr(module, name, getattr(buggy, name))
    return put_back


def test_the_named_specs_pass_clean(kernel_specs):
    """(The engine specs' expectations are checked when their clean goldens are recorded.)"""
    for spec_id in ("kernels/router-top4-ties", "kernels/sampling-gumbel-endpoints", "coins/gumbel-endpoints"):
        kernel_specs.green(spec_id)


# --------------------------------------------------------------------------- empty tile
def attention_running_max_from_minus_inf(q, k_cache, v_cache, slots, positions, sinks, window, scale,
                                         backend="torch"):
    """lockstep.kernels.attention.attention_portable (torch backend) with the seed bug: the running max starts at -inf
    and the sink is merged after the last tile, so an empty first tile computes exp(-inf - -inf)."""
    T, Hq, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    sink_logits = sinks.to(torch.float32).reshape(Hkv, G, 1)
    tile_offsets = torch.arange(KV_TILE, dtype=torch.int64, device=q.device)
    out = q.new_empty((T, Hq, D))
    for t in range(T):
        qt = q[t].reshape(Hkv, G, D)
        keys, values = k_cache[slots[t]], v_cache[slots[t]]
        pos = positions[t]
        m = torch.full_like(sink_logits, float("-inf"))                 # the bug
        l = torch.zeros_like(sink_logits)
        acc = q.new_zeros((Hkv, G, D))
        for start in range(0, S, KV_TILE):
            s = torch.matmul(qt, keys[:, start:start + KV_TILE].transpose(1, 2)) * scale
            j = start + tile_offsets
            visible = (j <= pos) & ((j > pos - window) if window > 0 else True)
            s = torch.where(visible, s, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            rescale = torch.exp(m - m_new)
            p = torch.exp(s - m_new)
            l = l * rescale + p.sum(dim=-1, keepdim=True)
            acc = acc * rescale + torch.matmul(p, values[:, start:start + KV_TILE])
            m = m_new
        m_f = torch.maximum(m, sink_logits)
        l = l * torch.exp(m - m_f) + torch.exp(sink_logits - m_f)
        out[t] = (acc * torch.exp(m - m_f) / l).reshape(Hq, D)
    return out


def test_engine_empty_tile(engine_specs, monkeypatch):
    """Window 8, 32-key tiles: from position 40 on, a windowed layer's first tile is empty. The
    second request (30-token prompt) decodes past it and its logits turn NaN (argmax: token 0);
    the first (8 + 24 positions) never meets an empty tile, so its tokens stay (the sink merged
    last rounds differently, so its logprob bits move by a few ULPs)."""
    monkeypatch.setattr(lockstep.kernels.attention, "_attend", attention_running_max_from_minus_inf)   # the torch ops' attention
    report = engine_specs.red("generate/greedy-tiny-bf16")
    assert "tensor 'tokens_1'" in report and "got 0" in report, report
    assert "tensor 'tokens_0'" not in report


@pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:overflow encountered")
@pytest.mark.parametrize("spec_id", ["kernels/attention-empty-tiles-window-128",
                                     "kernels/attention-prefill-256-window-128",
                                     "kernels/attention-splits-window-128",
                                     "kernels/attention-splits-window-961"])
def test_triton_attention_empty_tile(kernel_specs, plant, spec_id):
    plant(lockstep.kernels.attention, {"m_use = tl.where(m_new == float(\"-inf\"), 0.0, m_new)   # empty so far: no NaN":
                              "m_use = m_new"}, "_attention_kernel", "_attention_split_kernel")
    assert "non-finite values, first at" in kernel_specs.red(spec_id)


@pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:overflow encountered")
def test_triton_attention_split_k_window_start(kernel_specs, plant):
    """Split-K's window code at the default split: each token's programs start at the split of its
    first visible key (split_lo). Starting every token at split 0 instead leaves the tokens whose
    window lies wholly in the second split (1984, 2015) with their empty split-0 tile and no keys;
    the window-128 spec, whose 3-tile walk never takes the split-K launch, cannot see it."""
    plant(lockstep.kernels.attention, {"    sp = split_lo + z\n": "    sp = z + split_lo * 0\n"}, "_attention_split_kernel")
    assert "kernel attention" in kernel_specs.red("kernels/attention-splits-window-961")
    kernel_specs.green("kernels/attention-splits-window-128")


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_triton_attention_row_without_keys_or_sink(kernel_specs, plant):
    """The merge of the sink after the last tile, for a row that saw no key and has no sink."""
    plant(lockstep.kernels.attention, {"m_fu = tl.where(m_f == float(\"-inf\"), 0.0, m_f)": "m_fu = m_f"}, "_attention_kernel")
    assert "non-finite values, first at" in kernel_specs.red("kernels/attention-all-masked-no-sink")
    kernel_specs.green("kernels/attention-all-masked")           # a finite sink: the guard is not needed


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("guard", ["    m = torch.where(m == float(\"-inf\"), 0.0, m)",
                                   "    l = torch.where(l == 0.0, 1.0, l)"])
def test_torch_reference_attention_all_masked(kernel_specs, plant, guard):
    """The reference's two guards for a row with no visible key and a -inf sink (max = -inf, l = 0):
    either one taken out gives NaN (exp(-inf - -inf), or 0 / 0), and only the spec added for that
    row sees it."""
    plant(lockstep.kernels.attention, {guard: "    pass"}, "_attend")
    assert "max |lockstep - reference| = inf" in kernel_specs.red("kernels/attention-all-masked-no-sink")
    kernel_specs.green("kernels/attention-all-masked")           # a finite sink: the guard is not needed


# --------------------------------------------------------------------------- N and K tails
@pytest.mark.parametrize("spec_id", ["kernels/matmul-n127-k129", "kernels/matmul-n1-k1",
                                     "kernels/matmul-n129-k127-bf16"])
def test_matmul_k_tail_dropped(kernel_specs, plant, spec_id):
    plant(lockstep.kernels.matmul, {"for k0 in range(0, K, BLOCK_K):": "for k0 in range(0, K // BLOCK_K * BLOCK_K, BLOCK_K):"},
          "_linear_kernel")
    assert "max |lockstep - reference|" in kernel_specs.red(spec_id)


@pytest.mark.parametrize("spec_id", ["kernels/matmul-n127-k129", "kernels/matmul-n129-k127-bf16"])
def test_matmul_n_tail_never_stored(kernel_specs, plant, spec_id):
    """Programs past the last full N block store nothing (an early exit): the tail stays garbage."""
    plant(lockstep.kernels.matmul, {"             mask=m_ok[:, None] & n_ok[None, :])":
                           "             mask=m_ok[:, None] & (rn < N // BLOCK_N * BLOCK_N)[None, :])"},
          "_linear_kernel")
    kernel_specs.red(spec_id)


@pytest.mark.parametrize("spec_id", ["kernels/rmsnorm-n127", "kernels/rmsnorm-n2881", "kernels/rmsnorm-n1"])
def test_rmsnorm_tail_left_out_of_the_sum(kernel_specs, plant, spec_id):
    plant(lockstep.kernels.rmsnorm, {"    sq = tl.zeros((BLOCK_N,), dtype=tl.float32)\n    for n0 in range(0, N, BLOCK_N):":
                            "    sq = tl.zeros((BLOCK_N,), dtype=tl.float32)\n"
                            "    for n0 in range(0, N // BLOCK_N * BLOCK_N, BLOCK_N):"},
          "_rmsnorm_kernel")
    kernel_specs.red(spec_id)


def test_grouped_expert_k_tail_dropped(kernel_specs, monkeypatch, tmp_path):
    """The tile loop the grouped expert kernels (the engine's MoE on the Triton ops) reduce with,
    kernels/matmul.py `_chunk_acc`, without its last partial BLOCK_K step. lockstep.kernels.moe imported it by
    name, so the buggy copy is put there (the interpreter looks a kernel's callees up at call time)."""
    buggy = module_with(lockstep.kernels.matmul, {"    for j0 in range(0, width, BLOCK_K):":
                                         "    for j0 in range(0, width // BLOCK_K * BLOCK_K, BLOCK_K):"}, tmp_path)
    monkeypatch.setattr(lockstep.kernels.moe, "_chunk_acc", buggy._chunk_acc)
    assert "kernel experts" in kernel_specs.red("kernels/experts-block-tails")


# --------------------------------------------------------------------------- top-k ties
def higher_index_first(logits, k, backend="torch"):
    values, ids = torch.sort(logits, dim=-1, stable=True)            # ascending, then reversed
    return values.flip(-1)[..., :k], ids.flip(-1)[..., :k]


def torch_topk(logits, k, backend="torch"):
    return torch.topk(logits, k, dim=-1)                             # CPU: ties not by the lower id


@pytest.mark.parametrize("bug", [higher_index_first, torch_topk], ids=["higher-id-first", "torch.topk"])
def test_engine_router_top_k_ties(engine_specs, kernel_specs, monkeypatch, bug):
    """The top-k the torch backend runs in every MoE layer: generate/router-ties sees it, and so does
    the router's kernel spec, whose reference is that same function (one torch definition per op:
    the spec pins what the torch ops run)."""
    monkeypatch.setattr(lockstep.kernels.moe_router, "top_k_lowest_index", bug)    # the torch ops' route calls it
    engine_specs.red("generate/router-ties")
    assert "kernel router_top_k" in kernel_specs.red("kernels/router-top4-ties")


def test_triton_router_ties(kernel_specs, plant):
    """The kernel the engine's triton backend runs for its router top-k."""
    plant(lockstep.kernels.moe_router, {"idx = tl.min(tl.where((~taken) & (cand == m), e, E_PAD), axis=0)   # lowest id on ties":
                        "idx = tl.max(tl.where((~taken) & (cand == m), e, -1), axis=0)"}, "_router_top_k_kernel")
    assert "kernel router_top_k" in kernel_specs.red("kernels/router-top4-ties")


def test_torch_reference_router_ties(kernel_specs, monkeypatch):
    monkeypatch.setattr(lockstep.kernels.moe, "router_top_k_portable",
                        lambda logits, k: (torch.softmax(torch.topk(logits.float(), k).values, -1),
                                           torch.topk(logits.float(), k).indices))
    kernel_specs.red("kernels/router-top4-ties")


# --------------------------------------------------------------------------- Gumbel endpoints
def unclamped_gumbel(h):
    """lockstep.kernels.coins.gumbel_from_hash without its clamp (runs with that module's globals)."""
    return -torch.log(-torch.log(uniform_from_hash(h)))   # noqa: F821


@pytest.mark.filterwarnings("ignore:divide by zero encountered")
def test_unclamped_gumbel_in_the_engine(engine_specs, kernel_specs, monkeypatch):
    """The torch noise lockstep.engine.sampling draws with (lockstep.kernels.coins.gumbel_from_hash). Its code is
    swapped in place, so every module that imported the function by name sees the bug."""
    monkeypatch.setattr(lockstep.kernels.coins.gumbel_from_hash, "__code__", unclamped_gumbel.__code__)
    report = engine_specs.red("generate/gumbel-endpoints")
    assert "request 0 ended on token 0, the spec expects 340" in report
    assert "request 1 ended on token 405, the spec expects 340" in report
    assert "request 2 ended on token 405, the spec expects 340" in report
    assert "is not finite" in kernel_specs.red("coins/gumbel-endpoints")
    kernel_specs.red("kernels/sampling-gumbel-endpoints")       # its torch reference draws with it


@pytest.mark.filterwarnings("ignore:divide by zero encountered", "ignore:invalid value encountered")
def test_unclamped_gumbel_in_the_triton_sampler(kernel_specs, plant):
    plant(lockstep.kernels.sampling, {"log_u = tl.minimum(tl.maximum(log_f64(u, PORTABLE), -1.7976931348623157e308), "
                             "-2.3283064365386963e-10)": "log_u = log_f64(u, PORTABLE)"}, "_gumbel_argmax_kernel")
    report = kernel_specs.red("kernels/sampling-gumbel-endpoints")
    assert "max |lockstep - reference|" in report
    kernel_specs.green("kernels/sampling-vocab-1025")      # random keys never reach either end


def test_sampling_rows_errors_are_located():
    from lockstep.harness.specfile import SpecErrors, parse_spec

    text = ("kind: kernel\ndescription: d\ninputs:\n  kernel: sampling\n  shape: {R: 2, V: 8}\n  rows:\n"
            "    - {seed: 1, position: 2, logits: {'9': 0.0}}\n")
    with pytest.raises(SpecErrors) as e:
        parse_spec(text, "specs/kernels/bad.yaml", "kernels/bad")
    assert [str(x) for x in e.value.errors] == [
        "specs/kernels/bad.yaml:7:5: inputs.rows: expected R = 2 rows, found 1",
        "specs/kernels/bad.yaml:7:38: inputs.rows[0].logits: expected a mapping of vocab ids in [0, 8), written as "
        "quoted keys ('6': 0.0), to numbers"]
