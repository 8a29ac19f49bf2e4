"""Argument types shared by the subcommands: each refuses a bad value as a usage error naming it.

One definition per flag's meaning, so `--seed S[,S...]`, `--prompt-ids` and the bounds mean the
same thing in every command that takes them (`record --seed 3,4` as `generate --seed 3,4`)."""

from __future__ import annotations

import argparse

from lockstep.harness.errors import UsageError
from lockstep.harness.limits import WORLD_SIZES


def int_at_least(low: int, high: int | None = None):
    """An integer in [low, high] (no ceiling without `high`)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {v}")
        if high is not None and v > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {v}")
        return v
    return parse


def int_list(text: str) -> list[int]:
    """Comma-separated integers; an empty item (`1,,2`, a trailing comma) is an error, not skipped."""
    items = text.split(",")
    try:
        if any(not item.strip() for item in items):
            raise ValueError
        return [int(item, 0) for item in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def token_ids(text: str) -> list[int]:
    ids = int_list(text)
    for i in ids:
        if i < 0:
            raise argparse.ArgumentTypeError(f"token ids are >= 0, got {i} (a negative id is not a token)")
    return ids


def seeds(text: str) -> list[int]:
    """`--seed S[,S...]`: one seed for every prompt, or one per prompt; each in the range the engine's
    coins take (engine.sampling: a 64-bit key, signed or not)."""
    values = int_list(text)
    for v in values:
        if not -2**63 <= v < 2**64:
            raise argparse.ArgumentTypeError(f"a seed must be an int in [-2^63, 2^64), got {v}")
    return values


def int_in(low: int, end: int, shown: str):
    """An argparse type: an integer in [low, end), refused as a usage error naming the range otherwise
    (a seed past int64 used to reach torch and come back as `Overflow when unpacking long long`)."""
    def parse(text: str) -> int:
        try:
            value = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value < end:
            raise argparse.ArgumentTypeError(f"must be an integer in {shown}, got {text}")
        return value
    return parse


def bound(text: str) -> float:
    """A bound a flag raises: a positive number (`inf`: no bound); NaN would compare as no bound too, silently."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number (inf: no bound), got {text}")
    return value


def world_sizes(text: str) -> list[int]:
    sizes = int_list(text)
    for w in sizes:
        if w not in WORLD_SIZES:
            raise argparse.ArgumentTypeError(f"world size {w} is not one of {', '.join(map(str, WORLD_SIZES))} "
                                             "(the tensor-parallel degrees DESIGN D4 covers)")
    if len(set(sizes)) != len(sizes):
        raise argparse.ArgumentTypeError(f"a world size is listed twice in {text!r}")
    return sizes


def tag(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a tag must not be empty")
    return text


def per_prompt_seeds(given: list[int] | None, prompts: int, flag: str = "--prompt-ids") -> list[int | None]:
    """--seed's values spread over the prompts: one for all, or one each ([None] * n without --seed);
    any other count is refused (the same rule in generate and record)."""
    values = given or [None]
    if len(values) not in (1, prompts):
        raise UsageError(f"--seed gives {len(values)} seeds for {prompts} prompts: give one (every prompt) or one "
                         f"per {flag}")
    return values * prompts if len(values) == 1 else list(values)


class Deprecated(argparse.Action):
    """An old spelling kept for one version: it stores into the new option's dest and says, on
    stderr, which spelling replaces it (CHANGELOG lists them)."""

    def __init__(self, option_strings, dest, new: str = "", **kw):
        self.new = new
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        import sys
        print(f"lockstep: warning: {option_string} is deprecated, use {self.new} (the old spelling goes in the "
              "next version)", file=sys.stderr)
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def deprecated(p: argparse.ArgumentParser, old: str, new: str, dest: str, **kw) -> None:
    """Register `old` as a deprecated alias of option `new` (same dest, hidden from --help)."""
    p.add_argument(old, dest=dest, action=Deprecated, new=new, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                   **kw)


class Parser(argparse.ArgumentParser):
    """Every usage error as one line with the one prefix, `lockstep: error:` (argparse's own dumps
    the usage first, with the subcommand's name in the prefix), and exit 2."""

    def error(self, message: str):
        import sys
        cmd = self.prog.removeprefix("lockstep").strip()
        hint = f" (see `lockstep {cmd} --help`)" if cmd else " (see `lockstep --help`)"
        print(f"lockstep: error: {message}{hint}", file=sys.stderr)
        raise SystemExit(2)
