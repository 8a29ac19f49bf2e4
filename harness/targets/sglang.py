"""Target `sglang`: SGLang 0.5.23's own functions and Triton kernels (pip install --no-deps sglang==0.5.23).

What each operation drives (Triton kernels run in the interpreter on the CPU):

| operation | SGLang code | how it is reached |
| --- | --- | --- |
| hash | `sglang.kernels.ops.sampling.murmur_hash.murmur_hash32_kernel` | launched as its wrapper's CUDA branch does (grid (n, cdiv(m, 1024))); the wrapper's CPU branch is a C++ op of the sgl_kernel wheel, which is not installed |
| verify_coins | `sglang.srt.speculative.eagle_utils._seeded_verify_coins` | the function compiled from the installed file (its module imports the whole runtime), calling the hash above |
| eagle3_layers | `GptOssForCausalLM.set_eagle3_layers_to_capture` (`sglang.srt.models.gpt_oss`) | the method compiled from the installed file and called on a stand-in `self`; ids read as `spec_aux_hidden_state.py` does (`eagle_config["eagle_aux_hidden_state_layer_ids"]`, else none); the capture order is GptOssModel.forward's loop (boundary i captured at block i, L at the final norm) |
| verify_greedy | `sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_triton` | the Triton path (SGLang's XPU branch) compiled from the installed file |
| verify_rejection | `sglang.kernels.ops.speculative.reject_sampling.chain_speculative_sampling_triton` | imported; probabilities in float32 as eagle_sample passes them |
| verify_target_only | `sglang.kernels.ops.speculative.sampling.tree_speculative_sampling_target_only` | CUDA only (a JIT-compiled .cuh kernel) |
| attention | `sglang.kernels.ops.attention.extend_attention.extend_attention_fwd` | one request: prefix = keys before the first query, the queries' span as the extend; window = `get_attention_sliding_window_size` (sliding_window − 1); in the interpreter only the query blocks holding an asked query run (`_asked_blocks`) |

Shim: `sglang.srt.utils` (which imports the server stack) is replaced, for the attention modules
only, by a module with the platform predicates they import (`is_hip`, `is_cuda`, …), answering
for this machine.
"""

from __future__ import annotations

import types
from typing import List, Optional, Tuple

import torch

from lockstep.harness.targets import peer
from lockstep.harness.target import CPU, CUDA, INTERPRETER, NotApplicable, Op, Target, UpstreamChanged

VERSION = "0.5.23"
KERNEL_WHERE = (INTERPRETER, CUDA)


def _platform_stub():
    cuda = torch.cuda.is_available()
    no = lambda *a, **k: False  # noqa: E731
    peer.stub_module("sglang.srt.utils", is_cuda=lambda: cuda, is_hip=no, is_npu=no, is_musa=no, is_xpu=no,
                     is_cpu=no, is_gfx95_supported=no, is_gfx1250_supported=no,
                     get_device_core_count=lambda *a, **k: torch.cuda.get_device_properties(0).multi_processor_count
                     if cuda else 1)


class SGLang:
    def __init__(self, edits: dict | None = None):
        """`edits` (tests only): {"verify_coins" | "attention" | "eagle3_layers": text -> text} breaks one
        piece of SGLang on purpose, to show that its spec turns red."""
        self.edits = edits or {}
        peer.require_version("sglang", VERSION)
        mh = peer.import_leaf("sglang.kernels.ops.sampling.murmur_hash")
        self.hash_kernel = peer.attr(mh, "murmur_hash32_kernel", ["seed_ptr", "positions_ptr", "col_indices_ptr",
                                                                  "output_ptr", "num_rows", "num_cols", "BLOCK_SIZE"])
        self.mh = mh
        self.mh_wrapper = peer.attr(mh, "murmur_hash32", ["seed", "positions", "col_indices"])
        ns = {"torch": torch, "Tuple": Tuple}
        self.seeded_coins = peer.require(peer.function_from_source(
            "sglang.srt.speculative.eagle_utils", "_seeded_verify_coins", ns, transform=self.edits.get("verify_coins")),
            "sglang.srt.speculative.eagle_utils._seeded_verify_coins")
        ns = {"Optional": Optional, "List": List}
        self.set_layers = peer.require(peer.method_from_source(
            "sglang.srt.models.gpt_oss", "GptOssForCausalLM", "set_eagle3_layers_to_capture", ns),
            "sglang.srt.models.gpt_oss.GptOssForCausalLM.set_eagle3_layers_to_capture", ["self", "layer_ids"])
        if "eagle3_layers" in self.edits:
            self.set_layers = self.edits["eagle3_layers"](self.set_layers)
        import triton
        import triton.language as tl
        ns = {"torch": torch, "triton": triton, "tl": tl}
        peer.function_from_source("sglang.kernels.ops.speculative.spec_tree", "verify_tree_greedy_kernel_triton", ns)
        self.greedy = peer.require(peer.function_from_source(
            "sglang.kernels.ops.speculative.spec_tree", "verify_tree_greedy_triton", ns),
            "sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_triton",
            ["predicts", "accept_index", "accept_token_num", "candidates", "retrieve_index", "retrieve_next_token",
             "retrieve_next_sibling", "target_predict"])
        rs = peer.import_leaf("sglang.kernels.ops.speculative.reject_sampling")
        self.chain = peer.attr(rs, "chain_speculative_sampling_triton",
                               ["predicts", "accept_index", "accept_token_num", "candidates", "retrive_index",
                                "retrive_next_token", "retrive_next_sibling", "uniform_samples",
                                "uniform_samples_for_final_sampling", "target_probs", "draft_probs",
                                "threshold_single", "threshold_acc", "deterministic"])
        self.window_size = peer.require(peer.function_from_source(
            "sglang.srt.models.gpt_oss", "get_attention_sliding_window_size", {}),
            "sglang.srt.models.gpt_oss.get_attention_sliding_window_size", ["config"])
        self._extend = None

    # ------------------------------------------------------------------ coins
    def hash(self, seed, pos, col):
        if seed.device.type != "cpu":
            return self.mh_wrapper(seed, pos, col).to(torch.int64)
        n, m = seed.shape[0], col.shape[0]
        out = torch.empty((n, m), dtype=torch.uint32)
        import triton
        self.hash_kernel[(n, triton.cdiv(m, 1024))](seed.contiguous(), pos.contiguous(), col.contiguous(), out, n, m,
                                                    BLOCK_SIZE=1024)
        return out.to(torch.int64)

    def verify_coins(self, seeds, seq_lens, n):
        # _seeded_verify_coins imports murmur_hash32 from its module when called: on the CPU that
        # wrapper needs sgl_kernel, so the call sees the kernel launch above for its duration.
        saved = self.mh.murmur_hash32
        self.mh.murmur_hash32 = lambda s, p, c: self.hash(s.to(torch.int64) if s.dtype == torch.uint64 else s,
                                                          p.to(torch.int64) if p.dtype == torch.uint64 else p,
                                                          c).to(torch.uint32)
        try:
            return self.seeded_coins(sampling_seed=seeds, seq_lens=seq_lens, draft_token_num=n, device=seeds.device)
        finally:
            self.mh.murmur_hash32 = saved

    # ------------------------------------------------------------------ layer ids
    def eagle3_layers(self, draft_config, convention, num_layers, fc_in, hidden, name, direct_ids=False):
        eagle_config = draft_config.get("eagle_config")
        try:        # spec_aux_hidden_state.py: eagle_config["eagle_aux_hidden_state_layer_ids"], else None
            ids = eagle_config["eagle_aux_hidden_state_layer_ids"]
        except Exception:
            ids = None
        if direct_ids:   # a spec's `ids:` go where SGLang reads them
            ids = draft_config.get("eagle_aux_hidden_state_layer_ids")
        me = types.SimpleNamespace(pp_group=types.SimpleNamespace(is_last_rank=True),
                                   config=types.SimpleNamespace(num_hidden_layers=num_layers),
                                   model=types.SimpleNamespace(layers_to_capture=[]), capture_aux_hidden_states=False)
        self.set_layers(me, ids)
        wanted = me.model.layers_to_capture
        # GptOssModel.forward: block i captures boundary i if i is wanted; the final norm captures L.
        return [b for b in range(num_layers + 1) if b in wanted]

    # ------------------------------------------------------------------ verify
    @staticmethod
    def _tree_arrays(tree):
        n = len(tree.parents)
        nxt, sib = [-1] * n, [-1] * n
        for i in range(n - 1, 0, -1):      # prepend: siblings in ascending node order (build_tree_efficient)
            p = tree.parents[i]
            sib[i], nxt[p] = nxt[p], i
        as_t = lambda xs: torch.tensor([xs], dtype=torch.int64)  # noqa: E731
        return as_t(list(range(n))), as_t(nxt), as_t(sib), as_t(list(tree.tokens))

    @staticmethod
    def _path(accept_index, num):
        return [int(i) for i in accept_index[0, :int(num[0]) + 1].tolist()]

    def verify_greedy(self, tree, argmax):
        n = len(tree.parents)
        idx, nxt, sib, cand = self._tree_arrays(tree)
        predicts = torch.full((n,), -1, dtype=torch.int32)
        accept_index = torch.full((1, n), -1, dtype=torch.int32)
        num = torch.zeros(1, dtype=torch.int32)
        self.greedy(predicts, accept_index, num, cand, idx, nxt, sib, torch.tensor(argmax, dtype=torch.int64))
        path = self._path(accept_index, num)
        return path, int(argmax[path[-1]])      # eagle_sample: the bonus is target_predict at the last node

    def verify_rejection(self, tree, p, coins, final):
        n = len(tree.parents)
        idx, nxt, sib, cand = self._tree_arrays(tree)
        V = p.shape[-1]
        target = p.to(torch.float32)[None].contiguous()                    # [1, N, V]
        draft = torch.zeros(1, n, V, dtype=torch.float32)
        for node in range(1, n):                                           # row s: q of the child of node s
            draft[0, tree.parents[node]] = tree.q[node].to(torch.float32)
        predicts = torch.full((n,), -1, dtype=torch.int32)
        accept_index = torch.full((1, n), -1, dtype=torch.int32)
        num = torch.zeros(1, dtype=torch.int32)
        self.chain(predicts, accept_index, num, cand, idx, nxt, sib, coins.to(torch.float32)[None].contiguous(),
                   torch.tensor([final], dtype=torch.float32), target, draft, 1.0, 1.0, True)
        path = self._path(accept_index, num)
        return path, int(predicts[path[-1]])

    # ------------------------------------------------------------------ attention
    def extend_module(self):
        if self._extend is None:
            _platform_stub()
            peer.bare_packages("sglang.srt")
            if "attention" in self.edits:
                peer.import_leaf("sglang.kernels.ops.attention.decode_attention")
                self._extend = peer.module_from_source("sglang.kernels.ops.attention.extend_attention",
                                                       self.edits["attention"], "_lockstep_sglang_extend_edited")
            else:
                self._extend = peer.import_leaf("sglang.kernels.ops.attention.extend_attention")
        return peer.attr(self._extend, "extend_attention_fwd",
                         ["q_extend", "k_extend", "v_extend", "o_extend", "k_buffer", "v_buffer", "qo_indptr",
                          "kv_indptr", "kv_indices", "custom_mask", "is_causal", "mask_indptr", "max_len_extend",
                          "k_scale", "v_scale", "sm_scale", "logit_cap", "skip_prefix_custom_mask",
                          "sliding_window_size", "sinks"])

    def attention(self, q, k, v, positions, sinks, window, scale):
        fwd = self.extend_module()
        pos = positions.tolist()
        if max(pos) >= k.shape[0]:
            raise NotApplicable("a query past the key cache (an all-masked row) has no SGLang request layout: a "
                                "query's own key is always part of its extend")
        if q.dtype == torch.bfloat16 and q.device.type == "cpu":
            raise NotApplicable("bf16 tl.dot is wrong in Triton's interpreter (numpy has no bf16 matmul): "
                                "bf16 attention runs on CUDA only")
        lo, hi = min(pos), max(pos)
        n_ext = hi - lo + 1
        T, Hq, D = q.shape
        dev = q.device
        # Extend tensors are views of buffers PAD rows longer: the kernel's tail tiles form addresses
        # past the extend (harmless on a GPU's allocation, a segfault in the interpreter). kv_indices
        # is never empty for the same reason (a prefix of 0 keys passes one index it never reads).
        pad = 256

        def padded(rows, like, n):
            buf = torch.zeros(n + pad, *like.shape[1:], dtype=like.dtype, device=dev)
            if rows is not None:
                buf[:n] = rows
            return buf[:n]

        q_ext = padded(None, q, n_ext)
        q_ext[torch.tensor(pos) - lo] = q
        o = padded(None, q, n_ext)
        k_ext, v_ext = padded(k[lo:hi + 1], k, n_ext), padded(v[lo:hi + 1], v, n_ext)
        k_buf, v_buf = padded(k, k, k.shape[0]), padded(v, v, v.shape[0])
        sw = self.window_size(types.SimpleNamespace(sliding_window=window)) if window > 0 else -1
        with peer.only_programs(peer.attr(self._extend, "_fwd_kernel"), _asked_blocks([p - lo for p in pos])):
            fwd(q_ext, k_ext, v_ext, o, k_buf, v_buf,
                torch.tensor([0, n_ext], dtype=torch.int32, device=dev),
                torch.tensor([0, lo], dtype=torch.int32, device=dev),
                padded(torch.arange(lo, dtype=torch.int64, device=dev), torch.zeros(1, dtype=torch.int64), lo),
                None, True, None, n_ext, 1.0, 1.0, sm_scale=scale, sliding_window_size=sw,
                sinks=sinks.to(torch.float32))
        return o[torch.tensor(pos) - lo]


def _asked_blocks(rows: list[int]):
    """keep(grid index, args) for peer.only_programs: in the interpreter, SGLang's extend kernel
    runs only the programs whose BLOCK_M query rows hold an asked row of the extend (the others'
    rows, queries between the asked positions, are dropped by the adapter anyway). Its legacy grid
    is (request, head, query block), one program per block writing only that block's rows; the
    compact grid (AMD's) or an unknown signature runs whole. The column's cost (docs/gate.md)."""
    def keep(idx, args):
        block = args.get("BLOCK_M")
        if block is None or args.get("USE_COMPACT_TILE_GRID", True) not in (False, 0):
            return True
        block = int(getattr(block, "value", block))
        return any(idx[2] * block <= r < (idx[2] + 1) * block for r in rows)
    return keep


def load(edits: dict | None = None) -> Target:
    s = SGLang(edits)
    every = (CPU, CUDA)
    return Target(
        name="sglang", version=VERSION,
        description="SGLang 0.5.23: its hash kernel, seeded verify coins, gpt-oss EAGLE3 capture rule, verify "
                    "kernels and Triton extend attention",
        conventions=("sglang",),
        ops={
            "hash": Op(s.hash, KERNEL_WHERE, "murmur_hash32_kernel (Triton)"),
            "verify_coins": Op(s.verify_coins, KERNEL_WHERE, "eagle_utils._seeded_verify_coins"),
            "eagle3_layers": Op(s.eagle3_layers, every, "gpt_oss.GptOssForCausalLM.set_eagle3_layers_to_capture"),
            "verify_greedy": Op(s.verify_greedy, KERNEL_WHERE, "spec_tree.verify_tree_greedy_triton (Triton)"),
            "verify_rejection": Op(s.verify_rejection, KERNEL_WHERE,
                                   "reject_sampling.chain_speculative_sampling_triton (Triton)"),
            "attention": Op(s.attention, KERNEL_WHERE, "extend_attention.extend_attention_fwd (Triton)"),
        },
        missing={
            "gumbel": "SGLang computes Gumbel noise only inside multinomial_with_seed, which returns the argmax "
                      "(a torch.compile'd function of the server's sampler)",
            "verify_target_only": "tree_speculative_sampling_target_only is a JIT-compiled CUDA kernel "
                                  "(sglang/kernels/ops/speculative/sampling.py): CUDA only",
            "capture": "a whole-model forward needs SGLang's ModelRunner and server stack",
            "greedy_generate": "generation needs SGLang's server stack",
            "prefix_cache": "SGLang's prefix cache (the RadixCache of sglang.srt.mem_cache.radix_cache) lives in its "
                            "scheduler and is read only by its ModelRunner's prefills: without the server stack "
                            "there is no generation to compare a hit with",
            "rmsnorm": "SGLang's RMSNorm is a CUDA/JIT kernel (sgl_kernel); no Triton path on the CPU",
            "sampling": "multinomial_with_seed is inside the server's sampler module (torch.compile, runtime imports)",
        })
