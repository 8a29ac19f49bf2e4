"""Target `vllm`: vLLM 0.33.0's own functions and Triton code (pip install --no-deps vllm==0.33.0).

| operation | vLLM code | how it is reached |
| --- | --- | --- |
| hash | `vllm.v1.worker.gpu.sample.gumbel.murmur3_hash32` (a `triton.jit` function, domain 0) | CUDA only: called from a one-line Lockstep kernel over the key grid (vLLM has no hash kernel of its own); Triton 3.9's interpreter raises inside it, so on the CPU the coins specs are n/a |
| eagle3_layers | `get_eagle3_aux_layers_from_config` (Model Runner V2, the default runner: `vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils`), else `SupportsEagle3.get_eagle3_default_aux_hidden_state_layers` | both compiled from the installed files (their modules import the config stack) and called on stand-ins; the capture order is GptOssModel.forward's (`_maybe_add_hidden_state` at 0, then i + 1 after block i) |

Not run: verify coins and Gumbel noise (vLLM draws uniforms as (h + 0.5)·2^−32 from murmur3_uniform32/64
and keys its draws by request position and token, not DESIGN §5's (seed, committed length, column)
coins), its verify kernels (rejection with vLLM's own uniform draws), attention (a paged unified
kernel behind vLLM's attention metadata), whole-model runs.
"""

from __future__ import annotations

import types

import torch
import triton
import triton.language as tl

from lockstep.harness.targets import peer
from lockstep.harness.target import CPU, CUDA, INTERPRETER, Op, Target

VERSION = "0.33.0"
_murmur = None


@triton.jit
def _hash_grid(seed_ptr, pos_ptr, col_ptr, out_ptr, m, BLOCK: tl.constexpr):
    # one row (seed, pos) × BLOCK columns, through vLLM's own murmur3_hash32
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < m
    col = tl.load(col_ptr + cols, mask=ok, other=0)
    seed = tl.load(seed_ptr + row + cols * 0)
    pos = tl.load(pos_ptr + row + cols * 0)
    h = _murmur(seed, pos, col)
    tl.store(out_ptr + row * m + cols, h.to(tl.int64), mask=ok)


class VLLM:
    def __init__(self, edits: dict | None = None):
        global _murmur
        self.edits = edits or {}
        peer.require_version("vllm", VERSION)
        gumbel = peer.import_leaf("vllm.v1.worker.gpu.sample.gumbel")
        _murmur = peer.attr(gumbel, "murmur3_hash32", ["seed", "pos", "offset", "domain"])
        _hash_grid.fn.__globals__["_murmur"] = _murmur      # the kernel body calls vLLM's function
        self.layers_from_config = peer.require(peer.function_from_source(
            "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils", "get_eagle3_aux_layers_from_config", {}),
            "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils.get_eagle3_aux_layers_from_config", ["spec_config"])
        self.default_layers = peer.require(peer.method_from_source(
            "vllm.model_executor.models.interfaces", "SupportsEagle3", "get_eagle3_default_aux_hidden_state_layers",
            {}), "vllm.model_executor.models.interfaces.SupportsEagle3.get_eagle3_default_aux_hidden_state_layers",
            ["self"])
        if "eagle3_layers" in self.edits:
            self.layers_from_config = self.edits["eagle3_layers"](self.layers_from_config)

    def hash(self, seed, pos, col):
        n, m = seed.shape[0], col.shape[0]
        out = torch.empty((n, m), dtype=torch.int64, device=seed.device)
        block = 256
        _hash_grid[(n, triton.cdiv(m, block))](seed.contiguous(), pos.contiguous(), col.contiguous(), out, m,
                                              BLOCK=block)
        return out

    def eagle3_layers(self, draft_config, convention, num_layers, fc_in, hidden, name, direct_ids=False):
        # the draft's hf_config: vLLM's EAGLEConfig keeps config.json's keys as attributes
        hf_config = types.SimpleNamespace(**draft_config)
        spec_config = types.SimpleNamespace(draft_model_config=types.SimpleNamespace(hf_config=hf_config))
        layers = self.layers_from_config(spec_config)
        if not layers:
            model = types.SimpleNamespace(model=types.SimpleNamespace(layers=[None] * num_layers))
            layers = self.default_layers(model)
        # GptOssModel.forward: boundary 0 before the loop, i + 1 after block i (_maybe_add_hidden_state)
        return [b for b in range(num_layers + 1) if b in layers]


def load(edits: dict | None = None) -> Target:
    v = VLLM(edits)
    return Target(
        name="vllm", version=VERSION,
        description="vLLM 0.33.0: its MurmurHash3 Triton function and its EAGLE3 aux-layer rule (Model Runner V2)",
        conventions=("boundary",),
        ops={
            "hash": Op(v.hash, (CUDA,), "gumbel.murmur3_hash32 (triton.jit); not yet checked on a GPU"),
            "eagle3_layers": Op(v.eagle3_layers, (CPU, CUDA), "eagle3_utils.get_eagle3_aux_layers_from_config"),
        },
        missing={   # `hash` on the CPU: see the Op's where (Triton 3.9's interpreter raises InterpreterError
                    # "'NoneType' object has no attribute 'scalar'" inside murmur3_hash32)
            "verify_coins": "vLLM has no DESIGN §5 verify coins: its uniforms are (h + 0.5)·2^-32 "
                            "(gumbel.murmur3_uniform32/64), keyed by request position and token",
            "gumbel": "vLLM's Gumbel noise is fused into its sampling kernel (gumbel_noised_argmax), on its own "
                      "midpoint uniforms",
            "sampling": "vLLM's sampler draws its Gumbel noise inside its sampling kernel (gumbel_noised_argmax) "
                        "from its own midpoint uniforms, not under the coin contract",
            "verify_greedy": "vLLM's verify is its rejection sampler over a padded batch layout: not driven yet",
            "verify_target_only": "vLLM has no target-only tree verification",
            "verify_rejection": "vLLM's rejection sampler draws its own uniforms; not driven yet",
            "attention": "vLLM's Triton attention is the paged unified kernel behind its attention metadata: "
                         "not driven yet",
            "capture": "a whole-model forward needs vLLM's engine",
            "greedy_generate": "generation needs vLLM's engine",
            "prefix_cache": "vLLM's prefix caching (vllm.v1.core.kv_cache_manager's block hashes) runs inside its "
                            "engine core: without vLLM's engine there is no generation to compare a hit with",
        })
