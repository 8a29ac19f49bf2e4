"""Lockstep's reference gpt-oss engine (CPU, fp32, bitwise deterministic; DESIGN §2, §7).

Read in this order:
  config.py      GptOssConfig: HF config.json in and out, named presets
  mxfp4.py       the MXFP4 block format: dequantize, and quantize for synthetic checkpoints
  checkpoint.py  load_checkpoint (HF layout, bf16 or MXFP4 experts), make_checkpoint (synthetic)
  linear.py      the one batch-invariant linear layer; linear_k_chunked, the fixed K-chunk tree
  rope.py        YaRN RoPE
  attention.py   sink + sliding-window attention over the KV cache, fixed key tiles
  kv_cache.py    the preallocated KV cache
  model.py       GptOssModel: the forward pass, prefill and decode alike, boundary capture
  trace.py       Trace: an optional op-by-op record of one request's step (what `lockstep diff` compares)
  sampling.py    greedy and seeded Gumbel-max sampling with top-k / top-p / min-p
  generate.py    Request, Result, generate()
  boundaries.py  EAGLE3 aux layer ids -> hidden-state boundaries (DESIGN §3)
  eagle3.py      EAGLE3 draft head: config, checkpoint I/O (SpecForge layout), forward, make_draft_checkpoint
  speculative.py speculative_generate: chain/tree drafting, greedy/target-only/rejection verify
  distributed.py Topology (tp × ep), ParallelContext, all-gather + fixed-tree invariant_sum (D4)
  parallel.py    shard(model, ctx): a GptOssModel made one TP/EP rank, bitwise equal to one device; generate_at
  launch.py      launch(fn, world_size): local ranks over gloo, NCCL or gloo-host (a shared GPU); failures named
"""
