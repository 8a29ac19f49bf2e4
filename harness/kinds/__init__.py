"""Spec kinds: one runner module per kind.

A kind module defines
    NAME                     the `kind:` value of its specs
    INPUTS, EXPECT           schemas (harness.schema.Map) of the `inputs` and `expect` fields
    EXTRA_FIELDS (optional)  schemas of further top-level fields
    validate(doc) (optional) cross-field rules → list[harness.schema.Problem]
    golden_platform(spec, ctx) → the platform name its golden is stored under
    run(spec, ctx) → harness.result.Result
    check(spec, result) → list[str], one message per failed expectation
"""

from harness.kinds import (coins, distribution, draft, generate, kernel, layer_ids, mxfp4, prefix_cache, primitive,
                           replay, verify)

KINDS = {module.NAME: module for module in (coins, layer_ids, generate, kernel, verify, distribution, mxfp4,
                                            draft, primitive, prefix_cache, replay)}
