"""Spec kinds: a kind is one module here plus its line in KINDS below.

A kind module defines
    NAME                     the `kind:` value of its specs
    INPUTS, EXPECT           schemas (harness.schema.Map) of the `inputs` and `expect` fields
    EXTRA_FIELDS (optional)  schemas of further top-level fields
    validate(doc) (optional) cross-field rules → list[harness.schema.Problem]
    golden_platform(spec, ctx) → the platform name its golden is stored under
    run(spec, ctx, target) → harness.result.SpecResult: the spec run through the target's
                             operations only (harness.target.TargetInterface: `op`,
                             `offers`); Lockstep's engine is the default target
                             (harness/targets/lockstep.py: engine(ctx), which implements every
                             operation and `has_goldens`: judged against the goldens bit for bit)
    check(spec, result) → list[str], one message per failed expectation
and, for targets judged against their expectations (harness/targets/judge.py):
    applicability(spec, target, device) (optional) → how a run is compared ("bitwise",
                             "tolerance", "chi-square"), or NotApplicable with the reason;
                             without it, the kind is n/a on every other target
    compared(spec, ctx, result) (optional) → (how, golden platform or None); default: bitwise
                             against golden_platform(spec, ctx)
    refusal(result) (optional) → the message of a refusal the result records, or None: an
                             expected refusal is then judged by its facts, not its wording
    locate_golden(spec, golden, got) (optional) → where a golden mismatch first parts
tests/test_kind_registry.py shows a whole kind in one module: registered, it runs through `check`
on Lockstep's engine and through `check --target` on another target.
"""

from lockstep.harness.kinds import (coins, distribution, draft, generate, kernel, layer_ids, mxfp4, prefix_cache, primitive,
                           replay, verify)

KINDS = {module.NAME: module for module in (coins, layer_ids, generate, kernel, verify, distribution, mxfp4,
                                            draft, primitive, prefix_cache, replay)}
