"""Spec kind `coins`: the seeded-coin contract of DESIGN §5.

    kind: coins
    description: …
    inputs:                          # grid mode: every row (seed, position) × every column
      seeds: [0, 1, 42]              # one per row (IntSeq: list, arange or hashed)
      positions: [0, 7, 123]         # hash position per row (verify coins: committed length n);
                                     # a single seed or position applies to every row
      columns: [0, 1, 2]             # hash columns, for the `hash` and `gumbel` outputs
      draft_token_num: 8             # N, for the `coins` output (columns 0 … N)
      outputs: [hash, coins, gumbel]
    inputs:                          # keys mode: a list of whole keys, one value each
      keys: [[0, 0, 0], [1, 7, 1]]   # [seed, pos, col]
      outputs: [hash, coins, gumbel] # hash [k], coins [k] (the coin of each hash), gumbel [k]
    expect:                          # all optional; the golden is always compared bitwise
      hash: [[2167721464, …], …]     # known answers, exact
      coins: [[0.25, …], …]          # exact float32 values of the rejection coins
      final: [0.5, …]                # exact float32 values of the final coin
      equal_rows: [[0, 3]]           # rows that must be equal in every output
      distinct_rows: all             # or pairs: rows whose hashes differ in every column
      coins_in_unit_interval: true   # every coin and final coin in [0, 1)
      column_split: true             # coins[:, c] is hash column c, final is column N
      gumbel_finite: true
      reproducible: true             # a second run gives the same bits

The spec runs through the target's `hash`, `verify_coins` and `gumbel` operations only. A target
whose operations offer the feature "backends" (Lockstep's engine: the torch reference and the
Triton kernel) computes each output on every backend the spec names, and they must agree bitwise.
Outputs: `hash` [n, m] int64, `coins` [n, N] float32, `final` [n] float32, `gumbel` [n, m] float64. Hashes and coins are platform independent (golden/shared); specs
with Gumbel noise store per-platform goldens, since `log` may differ in its last bit.
"""

from __future__ import annotations

import struct

import torch

from lockstep.harness.intseq import INT64_MAX, INT64_MIN, IntSeq, length, materialize
from lockstep.harness.limits import MAX_COIN_CELLS, MAX_COIN_KEYS
from lockstep.harness.platform import SHARED
from lockstep.harness.result import SpecResult
from lockstep.harness.schema import Bool, Field, Float, Int, List, Map, OneOf, Problem, Str
from lockstep.harness.target import BITWISE, NotApplicable, TargetInterface
from lockstep.kernels.coins import COIN_MAX, murmur_hash32_torch

NAME = "coins"
OUTPUTS = ("hash", "coins", "gumbel")
UINT32 = Int(min=0, max=2**32 - 1)
MAX_DRAFT_TOKENS = 4096
BACKENDS = ("torch", "triton")        # the hashes that must agree, where the target offers "backends"

INPUTS = Map({
    "seeds": Field(IntSeq(), doc="request seeds, one per row"),
    "positions": Field(IntSeq(), doc="hash position per row; one value applies to every row"),
    "keys": Field(List(List(Int(min=INT64_MIN, max=INT64_MAX), min_len=3, max_len=3), min_len=1,
                       max_len=MAX_COIN_KEYS),
                  doc="[seed, pos, col] triples, instead of seeds/positions/columns"),
    "columns": Field(IntSeq(), doc="hash columns of the hash and gumbel outputs"),
    "draft_token_num": Field(Int(min=1, max=MAX_DRAFT_TOKENS), doc="N of the verify coins"),
    "outputs": Field(List(Str(choices=OUTPUTS), min_len=1), required=True),
    "backends": Field(List(Str(choices=BACKENDS), min_len=1), default=lambda: list(BACKENDS),
                      doc="hash backends that must agree bitwise"),
})
EXPECT = Map({
    "hash": Field(OneOf(List(List(UINT32)), List(UINT32))),
    "coins": Field(OneOf(List(List(Float())), List(Float()))),
    "final": Field(List(Float())),
    "equal_rows": Field(List(List(Int(min=0), min_len=2, max_len=2))),
    "distinct_rows": Field(OneOf(Str(choices=["all"]), List(List(Int(min=0), min_len=2, max_len=2)))),
    "coins_in_unit_interval": Field(Bool(), default=False),
    "column_split": Field(Bool(), default=False),
    "gumbel_finite": Field(Bool(), default=False),
    "reproducible": Field(Bool(), default=False),
})


def validate(doc: dict, root=None) -> list[Problem]:
    """Rules across fields: one input mode, what each output needs, shapes of the expectations."""
    inp, exp = doc["inputs"], doc["expect"] or {}
    if inp["keys"] is not None:
        return _validate_keys(inp, exp)
    out = []
    for name in ("seeds", "positions"):
        if inp[name] is None:
            out.append(Problem(("inputs",), f"missing required key {name!r} (or give 'keys')"))
    if out:
        return out
    rows = max(length(inp["seeds"]), length(inp["positions"]))
    for name in ("seeds", "positions"):
        if length(inp[name]) not in (1, rows):
            out.append(Problem(("inputs", name), f"expected 1 or {rows} values (one per row), "
                                                 f"found {length(inp[name])}"))
    outputs = set(inp["outputs"])
    if outputs & {"hash", "gumbel"} and inp["columns"] is None:
        out.append(Problem(("inputs",), "missing required key 'columns' (the hash and gumbel outputs need it)"))
    if "coins" in outputs and inp["draft_token_num"] is None:
        out.append(Problem(("inputs",), "missing required key 'draft_token_num' (the coins output needs it)"))
    out += _needs(inp, exp)
    cols = length(inp["columns"]) if inp["columns"] is not None else 0
    out += _grid_size(inp, rows, cols)
    for key, width in (("hash", cols), ("coins", inp["draft_token_num"] or 0)):
        table = exp.get(key)
        if table is not None and (len(table) != rows or any(not isinstance(r, list) or len(r) != width for r in table)):
            out.append(Problem(("expect", key), f"expected a {rows} x {width} table (rows x columns)"))
    if exp.get("final") is not None and len(exp["final"]) != rows:
        out.append(Problem(("expect", "final"), f"expected {rows} values, one per row, found {len(exp['final'])}"))
    pairs = (exp.get("equal_rows") or []) + (exp.get("distinct_rows") if isinstance(exp.get("distinct_rows"), list) else [])
    for pair in pairs:
        if max(pair) >= rows:
            out.append(Problem(("expect",), f"row pair {pair} is out of range: the spec has {rows} rows"))
    return out


def _grid_size(inp, rows: int, cols: int) -> list[Problem]:
    """The hash grid (rows x columns) and the coin grid (rows x (N + 1)) within MAX_COIN_CELLS."""
    out = []
    for what, width, where in (("hash", cols, "columns"), ("coin", (inp["draft_token_num"] or 0) + 1, "draft_token_num")):
        if width and rows * width > MAX_COIN_CELLS:
            out.append(Problem(("inputs", where), f"the {what} grid of {rows} rows x {width} columns has "
                                                  f"{rows * width:,} cells, more than {MAX_COIN_CELLS:,}"))
    return out


def _validate_keys(inp, exp) -> list[Problem]:
    out = [Problem(("inputs", name), "not used with 'keys' (keys give seed, pos and col themselves)", at_key=True)
           for name in ("seeds", "positions", "columns", "draft_token_num") if inp[name] is not None]
    out += [Problem(("expect", name), "not available with 'keys' (rows are keys, not requests)", at_key=True)
            for name in ("final", "equal_rows", "distinct_rows", "column_split") if exp.get(name)]
    out += _needs(inp, exp)
    for name in ("hash", "coins"):
        values = exp.get(name)
        if values is not None and (len(values) != len(inp["keys"]) or any(isinstance(v, list) for v in values)):
            out.append(Problem(("expect", name), f"expected a list of {len(inp['keys'])} values, one per key"))
    return out


def _needs(inp, exp) -> list[Problem]:
    needs = {"hash": "hash", "coins": "coins", "final": "coins", "column_split": "coins", "gumbel_finite": "gumbel",
             "coins_in_unit_interval": "coins"}
    return [Problem(("expect", key), f"needs {output!r} in inputs.outputs")
            for key, output in needs.items() if exp.get(key) and output not in inp["outputs"]]


def golden_platform(spec, ctx) -> str:
    return ctx.fixed_platform if "gumbel" in spec.inputs["outputs"] else SHARED


def _rows(inp, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(seeds [n], positions [n]): a single seed or position applies to every row."""
    seeds, pos = materialize(inp["seeds"]).to(device), materialize(inp["positions"]).to(device)
    n = max(seeds.shape[0], pos.shape[0])
    return seeds.expand(n).contiguous(), pos.expand(n).contiguous()


def run(spec, ctx, target: TargetInterface) -> SpecResult:
    """The target's `hash`, `verify_coins` and `gumbel` operations on the spec's keys or grid."""
    compute = _compute(spec, ctx, target)
    tensors = compute()
    data = {}
    if spec.expect.get("reproducible"):
        again = compute()
        data["second_run_identical"] = all(
            again[k].view(torch.uint8).equal(v.view(torch.uint8)) for k, v in tensors.items())
    return SpecResult(tensors=tensors, data=data)


TARGET_OPS = (("hash", "hash"), ("coins", "verify_coins"), ("gumbel", "gumbel"))   # output -> operation


def applicability(spec, target: TargetInterface, device: str) -> str:
    for output, op in TARGET_OPS:
        if output in spec.inputs["outputs"]:
            target.op(op, device)
    return BITWISE


def _compute(spec, ctx, t: TargetInterface):
    """compute() -> the outputs through the target's operations (NotApplicable up front); on the
    spec's backends where an operation offers "backends"."""
    inp = spec.inputs
    wanted, dev = inp["outputs"], str(ctx.device)
    ops = {op: _with_backends(t, op, dev, tuple(inp["backends"])) for output, op in TARGET_OPS if output in wanted}
    if inp["keys"] is not None and "coins" in wanted and "verify_coins" in ops:
        # a keys-mode coin is the coin of one hash; verify_coins gives it as column col of row (seed, pos)
        if any(k[2] < 0 or k[2] > 4096 for k in inp["keys"]):
            raise NotApplicable("keys-mode coins with columns outside 0 … 4096 need the coin of one hash, "
                                "which this target only exposes through verify_coins")
    return lambda: _keys(inp, ops) if inp["keys"] is not None else _grid(inp, ops)


def _with_backends(t: TargetInterface, op: str, device: str, backends: tuple[str, ...]):
    fn = t.op(op, device)
    return (lambda *args: fn(*args, backends=backends)) if t.offers(op, "backends") else fn


def _keys(inp, ops) -> dict[str, torch.Tensor]:
    """Keys mode, one key per call: the hash, the coin (column `col` of verify coins at (seed, pos))."""
    wanted, out = inp["outputs"], {}
    keys = torch.tensor(inp["keys"], dtype=torch.int64)
    s, p, c = keys[:, 0].contiguous(), keys[:, 1].contiguous(), keys[:, 2].contiguous()
    one = [(s[i:i + 1], p[i:i + 1], c[i:i + 1]) for i in range(len(s))]
    if "hash" in wanted:
        out["hash"] = torch.stack([ops["hash"](*key)[0, 0] for key in one])
    if "coins" in wanted:
        vc = [ops["verify_coins"](s[i:i + 1], p[i:i + 1], int(c[i]) + 1) for i in range(len(s))]
        out["coins"] = torch.stack([torch.cat([cs[0], f])[int(c[i])] for i, (cs, f) in enumerate(vc)])
    if "gumbel" in wanted:
        out["gumbel"] = torch.stack([ops["gumbel"](*key)[0, 0] for key in one])
    return out


def _grid(inp, ops) -> dict[str, torch.Tensor]:
    wanted, out = inp["outputs"], {}
    seeds, pos = _rows(inp, torch.device("cpu"))
    if inp["columns"] is not None:
        cols = materialize(inp["columns"])
        if "hash" in wanted:
            out["hash"] = ops["hash"](seeds, pos, cols).to(torch.int64)
        if "gumbel" in wanted:
            out["gumbel"] = ops["gumbel"](seeds, pos, cols).to(torch.float64)
    if "coins" in wanted:
        coins, final = ops["verify_coins"](seeds, pos, inp["draft_token_num"])
        out["coins"], out["final"] = coins.contiguous(), final.contiguous()
    return {k: v.cpu() for k, v in out.items()}


def _f32(x: float) -> float:
    """Round a Python float to the nearest float32, as torch's cast does."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _coin_py(h: int) -> float:
    """DESIGN §5 in plain Python floats: an independent check of the torch conversion."""
    return min(_f32(h / 4294967295), COIN_MAX)


def check(spec, result: SpecResult) -> list[str]:
    exp, t, fails = spec.expect, result.tensors, []

    def table_mismatch(name, got: torch.Tensor, want, cast):
        """First cell where the output differs from the spec's table, bitwise after the cast."""
        one_d = got.dim() == 1  # keys mode, or the final coins: one value per row
        got_rows = [[g] for g in got.tolist()] if one_d else got.tolist()
        want_rows = [[w] for w in want] if one_d else want
        for r, (g_row, w_row) in enumerate(zip(got_rows, want_rows)):
            for c, (g, w) in enumerate(zip(g_row, w_row)):
                if struct.pack("<d", float(g)) != struct.pack("<d", float(cast(w))):
                    where = f"[{r}]" if one_d else f"[{r}, {c}]"
                    fails.append(f"{name}{where} = {g!r}, the spec expects {cast(w)!r}")
                    return

    if exp.get("hash") is not None:
        table_mismatch("hash", t["hash"], exp["hash"], int)
    if exp.get("coins") is not None:
        table_mismatch("coins", t["coins"], exp["coins"], _f32)
    if exp.get("final") is not None:
        table_mismatch("final", t["final"], exp["final"], _f32)
    for i, j in exp.get("equal_rows") or []:
        for name, v in t.items():
            if v.dim() and not v[i:i + 1].view(torch.uint8).equal(v[j:j + 1].view(torch.uint8)):
                fails.append(f"rows {i} and {j} of {name!r} differ; the spec says they are equal")
    distinct = exp.get("distinct_rows")
    if distinct is not None:
        h = t["hash"] if "hash" in t else torch.cat([t["coins"], t["final"][:, None]], 1)
        rows = range(h.shape[0])
        pairs = [(i, j) for i in rows for j in rows if i < j] if distinct == "all" else distinct
        for i, j in pairs:
            same = (h[i] == h[j]).nonzero()
            if same.numel():
                fails.append(f"rows {i} and {j} agree at column {int(same[0, 0])}; the spec says they diverge")
                break
    if exp.get("coins_in_unit_interval"):
        for name in [n for n in ("coins", "final") if n in t]:
            v = t[name]
            bad = ((v < 0) | (v >= 1) | v.isnan()).nonzero()
            if bad.numel():
                idx = tuple(bad[0].tolist())
                fails.append(f"{name}{list(idx)} = {v[idx].item()!r} is outside [0, 1)")
    if exp.get("column_split"):
        fails.extend(_check_column_split(spec, t))
    if exp.get("gumbel_finite"):
        bad = (~torch.isfinite(t["gumbel"])).nonzero()
        if bad.numel():
            idx = tuple(bad[0].tolist())
            fails.append(f"gumbel{list(idx)} = {t['gumbel'][idx].item()!r} is not finite")
    if exp.get("reproducible") and not result.data.get("second_run_identical"):
        fails.append("a second run in the same process gave different bits")
    return fails


def _check_column_split(spec, t) -> list[str]:
    """coins[i, c] is the coin of hash column c and final[i] that of column N (DESIGN §5)."""
    inp = spec.inputs
    n_draft = inp["draft_token_num"]
    seeds, pos = _rows(inp, torch.device("cpu"))
    h = murmur_hash32_torch(seeds, pos, torch.arange(n_draft + 1)).tolist()
    coins, final = t["coins"].tolist(), t["final"].tolist()
    for i, row in enumerate(h):
        for c in range(n_draft):
            if coins[i][c] != _coin_py(row[c]):
                return [f"coins[{i}, {c}] = {coins[i][c]!r} is not the coin of hash column {c} ({_coin_py(row[c])!r})"]
        if final[i] != _coin_py(row[n_draft]):
            return [f"final[{i}] = {final[i]!r} is not the coin of hash column N = {n_draft} "
                    f"({_coin_py(row[n_draft])!r})"]
    return []
