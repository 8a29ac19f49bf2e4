"""What every rank runs in the topology trace test (launched rank processes import this by name):
op-level traces (engine.trace) of generate and speculative runs at each topology, which must
equal one device's element by element, every sharded op gathered to its one-device layout."""

from __future__ import annotations

from lockstep.engine.trace import OpTrace

from tests.parallel import scenarios, speculative_scenarios

GENERATE_AT = [(0, 0), (2, 3)]          # (request, step): request 0's prefill, request 2's decode step 3
SPECULATIVE_AT = [(2, 2)]               # request 2's verify round 2 (seeded, hot: rejection draws)


def one_device(ckpt: str) -> dict:
    from lockstep.engine.eagle3 import load_draft
    from lockstep.engine.generate import generate
    from lockstep.engine.model import GptOssModel
    from lockstep.engine.speculative import speculative_generate
    out = {}
    model = GptOssModel.from_checkpoint(ckpt)
    for r, s in GENERATE_AT:
        out["generate", r, s] = trace = OpTrace(r, s)
        generate(model, scenarios.requests(), capture=scenarios.CAPTURE, observer=trace)
    pair = speculative_scenarios.fitted_pair()
    target = GptOssModel.from_checkpoint(pair.target)
    draft = load_draft(pair.draft, target, convention=pair.convention)
    for r, s in SPECULATIVE_AT:
        out["speculative", r, s] = trace = OpTrace(r, s)
        speculative_generate(target, draft, speculative_scenarios.requests(), speculative_scenarios.SPECS["tree"],
                             observer=trace)
    return out


def run(ckpt: str, topologies: list[tuple[int, int]]) -> dict:
    from lockstep.engine import parallel
    from lockstep.engine.checkpoint import load_checkpoint
    from lockstep.engine.distributed import ParallelContext, Topology
    from lockstep.engine.generate import generate
    from lockstep.engine.model import GptOssModel
    config, weights = load_checkpoint(ckpt)
    pair = speculative_scenarios.fitted_pair()
    out = {}
    for tp, ep in topologies:
        ctx = ParallelContext(Topology(tp, ep))
        model = parallel.shard(GptOssModel(config, weights), ctx)
        for r, s in GENERATE_AT:
            out[tp, ep, "generate", r, s] = trace = OpTrace(r, s)
            generate(model, scenarios.requests(), capture=scenarios.CAPTURE, observer=trace)
        for r, s in SPECULATIVE_AT:
            run = parallel.TopologyRun(str(pair.target), Topology(tp, ep))
            _, trace = parallel._speculative_rank(ctx, run, speculative_scenarios.requests(), pair.draft,
                                                  pair.convention, speculative_scenarios.SPECS["tree"],
                                                  trace=OpTrace(r, s))
            out[tp, ep, "speculative", r, s] = trace
    return out
