"""Lockstep's reference gpt-oss engine (CPU, fp32, bitwise deterministic; DESIGN §2, §7).

Read in this order:
  config.py      GptOssConfig: HF config.json in and out, named presets
  mxfp4.py       the MXFP4 block format: dequantize, and quantize for synthetic checkpoints
  checkpoint.py  load_checkpoint (HF layout, bf16 or MXFP4 experts), make_checkpoint (synthetic)
  linear.py      the one batch-invariant linear layer
  rope.py        YaRN RoPE
  attention.py   sink + sliding-window attention over the KV cache, fixed key tiles
  kv_cache.py    the preallocated KV cache
  model.py       GptOssModel: the forward pass, prefill and decode alike, boundary capture
  sampling.py    greedy and seeded Gumbel-max sampling with top-k / top-p / min-p
  generate.py    Request, Result, generate()
  boundaries.py  EAGLE3 aux layer ids -> hidden-state boundaries (DESIGN §3)
"""
