"""Rejection verifiers with classic bugs switched in, for tests that must see specs turn red.

rejection() with no switches is DESIGN §6's rule (engine.speculative.verify_rejection, rewritten
independently); each switch puts back one bug:
    ignore_q         accept draft x iff u < p(x), ignoring q
    accept_on_equal  accept iff u q(x) <= p(x) instead of <
    residual_is_p    draw the correction from p instead of max(p - q, 0)
"""

from __future__ import annotations

from lockstep.engine.speculative import inverse_cdf


def rejection(ignore_q=False, accept_on_equal=False, residual_is_p=False):
    def verify_rejection(tree, p, coins, final_coin):
        cur, accepted = 0, [0]
        while True:
            kids = tree.children(cur)
            if not kids:
                return accepted, inverse_cdf(p[cur], final_coin)
            c = kids[0]
            x, q, u = tree.tokens[c], tree.q[c], float(coins[cur])
            lhs = u if ignore_q else u * float(q[x])
            if lhs <= float(p[cur, x]) if accept_on_equal else lhs < float(p[cur, x]):
                cur = c
                accepted.append(c)
                continue
            residual = p[cur] if residual_is_p else (p[cur] - q).clamp(min=0)
            return accepted, inverse_cdf(residual if bool((residual > 0).any()) else p[cur], final_coin)
    return verify_rejection
