"""The `lockstep` command line.

    lockstep list     [PATTERN ...] [--tag T]       the specs, one a line
    lockstep validate [PATTERN ...]                 check spec files only, run nothing
    lockstep check    [PATTERN ...] [--json] [--strict] [-j N]   the CI gate
    lockstep diff     PATTERN ...                   run and explain against the golden
    lockstep regen    [PATTERN ...] [--dry-run] [--allow-ci]
    lockstep report   [PATTERN ...] [--target T ...] --out PATH.md [-j N] [--json]
    lockstep expectations [PATTERN ...] --target T --write FILE [--versions RANGE] [-j N] [--json]
    lockstep suite                                  the installed suite's folder
    lockstep show     PATTERN ... [--pair P] [--bits] [--json]   goldens as text (--textconv FILE: git's driver)
    lockstep diff-driver [--uninstall]              install that driver into .git/config
    (list, check and diff take --target NAME: another implementation, see harness/targets)
    lockstep make-checkpoint --preset NAME --seed S --format bf16|mxfp4 OUT
    lockstep generate --checkpoint DIR --prompt-ids 1,2,3 [...] [--json]
    lockstep --version
    lockstep record OUT / replay TRACE / import-peer PEER / promote TRACE SPEC_ID   (harness/commands/replay.py)

Without --dtype / --backend, check, diff and regen run each spec under every (dtype policy,
backend) pair it has goldens for here (regen: every pair it supports), one row each: harness/pairs.py.

Patterns are globs over spec ids (`'coins/*'`). Exit codes of `check` and `diff`:
0 every spec matches its golden, 1 a mismatch (or a failed expectation, a crash, a corrupt
golden, or with --strict a stale golden), 2 a spec or usage error, 3 a missing golden, 4 a golden
recorded under another Triton (not comparable). When several apply, the order is 2, 1, 4, 3.

`main` is the one error boundary: a usage error is one line and exit 2, any other exception one
located line and exit 1 (its traceback with --debug), a closed stdout (`lockstep list | head`)
ends quietly. `--help`, `list` and `validate`'s parsing import neither torch nor the engine: this
file holds only the parser and the dispatch; each command's body is a module of harness/commands/
(imported when that command runs, with its imports at its top).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import warnings
from pathlib import Path

from lockstep.harness.commands.exits import EXIT_INTERRUPTED, EXIT_MISMATCH, EXIT_STDOUT_CLOSED, EXIT_USAGE
from lockstep.harness.commands.options import (Parser, bound, deprecated, int_at_least, int_in, seeds as seed_list,
                                               tag, token_ids, world_sizes)
from lockstep.harness.errors import UsageError, full_traceback, located, where, write_failure  # noqa: F401 - UsageError: also harness.cli's
from lockstep.harness.limits import MAX_CHECKPOINT_GB, MAX_DOCTOR_INPUTS, MAX_GENERATE_SECONDS, WORLD_SIZES
from lockstep.harness.commands.replay import add_commands as add_replay_commands
from lockstep.harness.suite_paths import parse_mapping
from lockstep.harness.jsonout import documents_only
from lockstep.harness.version import DISTRIBUTION, version


def command(module: str, name: str, **fixed):
    """The function `name` of harness/commands/`module`.py, imported when the command runs (so that
    `--help` loads no torch): what each subparser's `func` is."""
    def run(args):
        return getattr(importlib.import_module(f"lockstep.harness.commands.{module}"), name)(args, **fixed)
    return run


def _attach_dash_values(argv: list[str]) -> list[str]:
    """`--prompt-ids -1,2` as `--prompt-ids=-1,2`: argparse takes a value that starts with '-' (and
    is not a plain negative number) for an option and says "expected one argument"; attached, the
    value reaches token_ids, which names what is wrong with it."""
    out = []
    for tok in argv:
        if out and out[-1] in ("--prompt-ids", "--stop-ids") and re.fullmatch(r"-\d[\d,\s+-]*", tok):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


# --------------------------------------------------------------------------- option groups
def _debug(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show tracebacks (of crashes of the code under test, and of lockstep itself)")


def _common(p: argparse.ArgumentParser, patterns: str = "*") -> None:
    p.add_argument("patterns", nargs=patterns, metavar="PATTERN", help="spec id globs, e.g. 'coins/*'")
    p.add_argument("--tag", action="append", default=[], type=tag, help="only specs carrying this tag (repeatable)")
    p.add_argument("--specs", type=Path, default=Path("specs"), help="spec directory (default: ./specs)")
    p.add_argument("--golden", type=Path, default=Path("golden"), help="golden directory (default: ./golden)")
    p.add_argument("--suite", type=Path, action=_SuiteAction, metavar="DIR",
                   help="the suite in DIR: --specs DIR/specs --golden DIR/golden (e.g. \"$(lockstep suite)\")")
    p.add_argument("--checkpoint-path", type=_checkpoint_mapping, action="append", default=[],
                   metavar="SPEC_PATH=DIR", help="read the checkpoint a spec names SPEC_PATH from DIR, outside the "
                                                 "suite (repeatable)")
    _debug(p)


class _SuiteAction(argparse.Action):
    def __call__(self, parser, namespace, value, option_string=None):
        namespace.suite, namespace.specs, namespace.golden = value, value / "specs", value / "golden"


def _checkpoint_mapping(text: str):
    try:
        return parse_mapping(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _running(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], help="dtype policy (default: every pair with goldens "
                                                             "here; regen: every pair the spec supports)")
    p.add_argument("--backend", choices=["torch", "triton"], help="engine kernel backend (default: as --dtype)")
    p.add_argument("--world-size", type=world_sizes, default=[], metavar="W[,W...]",
                   help="also run each generate spec split over W processes, once tensor parallel (tp=W ep=1) "
                        "and once expert parallel (tp=1 ep=W), and require the one-device bits; W in "
                        f"{{{', '.join(map(str, WORLD_SIZES))}}}, each once (1 adds no run). A split the spec's "
                        "model cannot take or this machine cannot launch is not run, and the spec's notes name "
                        "it. Lockstep's engine only (torch.distributed: gloo on CPU, NCCL on GPU)")


def _json(p: argparse.ArgumentParser, more: str = "") -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output, one document on stdout" + more)


def _jobs(p: argparse.ArgumentParser, verb: str) -> None:
    p.add_argument("-j", "--jobs", type=int_at_least(1), default=None, metavar="N",
                   help=f"{verb} in N worker processes, reported as a serial run (default: the cores available)")


def _target(p: argparse.ArgumentParser, many: bool = False) -> None:
    if many:
        p.add_argument("--target", action="append", help="a target to report (repeatable; default: those of sglang, "
                                                         "vllm, hf that load here, the others listed as not run)")
    else:
        p.add_argument("--target", default="lockstep", help="the implementation under test: lockstep (default), "
                                                            "sglang, vllm, hf, or one registered under the entry "
                                                            "point group lockstep.targets")


def _expectations(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expectations", type=Path, metavar="FILE",
                   help="the target's expectations file (default: the target's own, or the shipped one whose "
                        "version range holds the target's version)")


# --------------------------------------------------------------------------- the parser
def _spec_parsers(sub) -> None:
    """The commands over specs: list, validate, check, diff, regen."""
    p = sub.add_parser("list", help="list the specs")
    _common(p)
    _target(p)
    _json(p)
    p.set_defaults(func=command("listing", "cmd_list"))
    p = sub.add_parser("validate", help="check spec files without running them")
    _common(p)
    _json(p)
    p.set_defaults(func=command("listing", "cmd_validate"))
    p = sub.add_parser("check", help="run specs and compare with their goldens bit for bit (the CI gate)")
    _common(p)
    _running(p)
    _json(p)
    p.add_argument("--strict", action="store_true", help="fail on stale goldens (whose spec is gone, or was edited "
                                                         "after they were recorded)")
    p.add_argument("--failed", action="store_true", help="only the rows the last check failed or found missing "
                                                         "(within the patterns given)")
    _jobs(p, "check")
    _target(p)
    _expectations(p)
    p.set_defaults(func=command("check", "cmd_check"))
    p = sub.add_parser("diff", help="run specs and explain each against its golden")
    _common(p, patterns="+")
    _running(p)
    _jobs(p, "run")
    _json(p, " (check's document)")
    _target(p)
    _expectations(p)
    p.set_defaults(func=command("check", "cmd_check", explain=True), strict=False)
    p = sub.add_parser("regen", help="record goldens: two identical runs, shown, then written atomically")
    _common(p)
    _running(p)
    p.add_argument("--dry-run", action="store_true", help="show what would change, write nothing")
    p.add_argument("--failed", action="store_true", help="only the rows the last check failed or found missing "
                                                         "(within the patterns given)")
    _jobs(p, "record")
    _json(p, " (the text report goes to stderr)")
    p.add_argument("--allow-ci", action="store_true", help="allow regeneration under CI (any truthy CI value)")
    p.set_defaults(func=command("regen", "cmd_regen"))


def _target_parsers(sub) -> None:
    """The commands over targets: report, expectations."""
    p = sub.add_parser("report", help="run targets and write the conformance matrix (Markdown and JSON)")
    _common(p)
    _running(p)
    _target(p, many=True)
    p.add_argument("--out", required=True, help="Markdown path (required: nothing is written where you did not "
                                               "say); the JSON goes beside it")
    _expectations(p)
    _jobs(p, "run")
    _json(p, " (the matrix's JSON, as written beside --out; the text line goes to stderr)")
    p.set_defaults(func=command("report", "cmd_report"))
    p = sub.add_parser("expectations", help="run specs on a target and write its expectations file from the "
                                            "observed failures, for review")
    _common(p)
    _running(p)
    p.add_argument("--target", required=True, help="the target (not lockstep: it has no expected failures)")
    p.add_argument("--write", type=Path, required=True, metavar="FILE", help="the expectations file to write")
    p.add_argument("--versions", help="the PEP 440 range the file holds for (default: ==the target's version)")
    _jobs(p, "run")
    _json(p, " (the file written and its counts; the text line goes to stderr)")
    p.set_defaults(func=command("report", "cmd_expectations"))


def _tool_parsers(sub) -> None:
    """The tools: suite, doctor, make-checkpoint."""
    p = sub.add_parser("suite", help="print the installed suite's folder (its specs/, golden/ and models/)")
    _json(p)
    _debug(p)
    p.set_defaults(func=command("suite", "cmd_suite"))
    p = sub.add_parser("doctor", help="check that every primitive of the CPU reference is IEEE on this machine")
    p.add_argument("--inputs", type=int_at_least(1024, MAX_DOCTOR_INPUTS), default=65536,
                   help=f"inputs per op (default 65536, at most {MAX_DOCTOR_INPUTS})")
    _json(p)
    _debug(p)
    p.set_defaults(func=command("doctor", "cmd_doctor"))
    p = sub.add_parser("make-checkpoint", help="write a synthetic checkpoint in the HF layout")
    p.add_argument("--preset", required=True, help="engine preset, e.g. tiny, small, tiny-d36")
    p.add_argument("--ckpt-seed", dest="seed", type=int_in(0, 2**63, "[0, 2^63)"), default=0,
                   help="the weights' seed (default 0; as record's --ckpt-seed)")
    deprecated(p, "--seed", "--ckpt-seed", "seed", type=int_in(0, 2**63, "[0, 2^63)"))
    p.add_argument("--format", choices=["bf16", "mxfp4"], default="bf16")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT")
    p.add_argument("--max-gb", type=bound, default=MAX_CHECKPOINT_GB, metavar="GB",
                   help=f"refuse to write more parameter bytes than this (default {MAX_CHECKPOINT_GB:g})")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the weights' arithmetic runs (default cpu); the same bytes on either, a GPU "
                        "makes the 20b shape in minutes")
    p.add_argument("out", type=Path, metavar="OUT")
    _json(p, " (the progress stays on stderr)")
    _debug(p)
    p.set_defaults(func=command("make_checkpoint", "cmd_make_checkpoint"))


def _show_parsers(sub) -> None:
    """Reviewing goldens: show, diff-driver."""
    p = sub.add_parser("show", help="print goldens readably: tokens as ids, logprobs in decimal, a block a request")
    p.add_argument("patterns", nargs="*", metavar="PATTERN", help="golden (spec) id globs, e.g. 'generate/*'")
    p.add_argument("--pair", choices=[f"{d}/{b}" for d in ("fp32", "bf16") for b in ("torch", "triton")],
                   help="only the golden folders of this dtype/backend pair (and shared/)")
    p.add_argument("--bits", action="store_true", help="print each float's bits beside its decimal value")
    p.add_argument("--full", action="store_true", help="print every value of large tensors (default: a digest a row)")
    p.add_argument("--golden", type=Path, default=Path("golden"), help="golden directory (default: ./golden)")
    p.add_argument("--suite", type=Path, action=_SuiteAction, metavar="DIR", help="the suite in DIR's golden/")
    p.add_argument("--textconv", type=Path, metavar="FILE", help="print one .safetensors file as text (what the "
                                                                 "git diff driver runs)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _debug(p)
    p.set_defaults(func=command("show", "cmd_show"))
    p = sub.add_parser("diff-driver", help="install the git diff driver that shows goldens' values in git diff")
    p.add_argument("--repo", type=Path, default=Path("."), help="the git repository (default: .)")
    p.add_argument("--uninstall", action="store_true", help="remove the driver from the repository's .git/config")
    _json(p)
    _debug(p)
    p.set_defaults(func=command("show", "cmd_diff_driver"))


def _generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate from a checkpoint with the reference engine")
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--prompt-ids", type=token_ids, action="append", required=True,
                   help="comma-separated token ids; repeat for a batch")
    p.add_argument("--seed", type=seed_list, metavar="S[,S...]",
                   help="seeded sampling: one seed for every prompt, or one per --prompt-ids (without: greedy)")
    p.add_argument("--temperature", type=float, help="default 1.0; needs --seed")
    p.add_argument("--top-k", type=int, help="default 0 (off); needs --seed")
    p.add_argument("--top-p", type=float, help="default 1.0 (off); needs --seed")
    p.add_argument("--min-p", type=float, help="default 0.0 (off); needs --seed")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--stop-ids", type=token_ids, help="replace the EOS list, e.g. --stop-ids 509,510")
    p.add_argument("--logprobs", action="store_true", help="include each token's logprob (and its float32 bits)")
    p.add_argument("--max-seconds", type=bound, default=MAX_GENERATE_SECONDS, metavar="S",
                   help=f"on the CPU, refuse a run estimated above S seconds (default {MAX_GENERATE_SECONDS})")
    p.add_argument("--backend", choices=["torch", "triton"], default="torch")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
    p.add_argument("--json", action="store_true")
    _debug(p)
    p.set_defaults(func=command("generate", "cmd_generate"))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lockstep", description="Deterministic-replay conformance harness "
                                                                  "for gpt-oss + EAGLE3 inference.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks (also accepted after the command)")
    parser.add_argument("--version", action="version", version=f"lockstep {_version()}",
                        help="the installed lockstep-harness version")
    sub = parser.add_subparsers(dest="command", required=True)
    _spec_parsers(sub)
    _target_parsers(sub)
    _tool_parsers(sub)
    _generate_parser(sub)
    _show_parsers(sub)
    add_replay_commands(sub)      # record, replay, import-peer, promote: harness/commands/replay.py
    return parser


class _Parser(Parser):
    """Parser (one error line, one prefix), except that --help and --version into a closed pipe raise BrokenPipeError (argparse
    swallows it and exits 0) so that they exit 141 as every command does."""

    def _print_message(self, message, file=None):
        if message and file is sys.stdout:
            file.write(message)
            file.flush()
            return
        super()._print_message(message, file)


# --------------------------------------------------------------------------- entry point
def _version() -> str:
    return f"{version()} ({DISTRIBUTION})"


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(_attach_dash_values(sys.argv[1:] if argv is None else list(argv)))
    except BrokenPipeError:                      # --help, --version into a closed pipe: 141, as every command
        return _stdout_closed()
    except SystemExit as e:  # argparse exits 2 on usage errors, as our contract wants, and 0 for --help
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if not args.debug:      # numpy's floating-point warnings are lockstep's to handle, never the user's to read
        warnings.filterwarnings("ignore", category=RuntimeWarning,
                                message=r"(overflow|underflow|invalid value|divide by zero) encountered")
    try:
        try:
            if getattr(args, "json", False):   # only the document on stdout, whatever a plugin prints
                with documents_only():
                    code = _in_world(args)
            else:
                code = _in_world(args)
        except ModuleNotFoundError as e:         # a third-party dependency missing: name it and its install
            missing = _missing_package(e)
            if missing is None:
                raise
            raise UsageError(f"this command needs the Python package {missing!r}, which is not installed here: "
                             f"pip install {missing}") from None
        sys.stdout.flush()  # inside the boundary: a closed pipe is noticed here, not at interpreter exit
        return code
    except UsageError as e:
        if args.debug and e.cause is not None:
            print(full_traceback(e.cause), file=sys.stderr)
        print(f"lockstep: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nlockstep: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _stdout_closed()
    except SystemExit as e:                       # a plugin's sys.exit must not end the run as a success
        print(f"lockstep: error: plugin or target code called sys.exit({e.code!r}) "
              f"({where(e) or 'at an unknown place'}); the run is not complete", file=sys.stderr)
        return EXIT_MISMATCH
    except Exception as e:  # noqa: BLE001 - the one boundary: nothing escapes as a traceback
        if write_failure(e) is not None:         # a full or read-only disk: the user's to fix, exit 2
            print(f"lockstep: error: cannot write {write_failure(e)}", file=sys.stderr)
            return EXIT_USAGE
        if args.debug:
            print(full_traceback(e), file=sys.stderr)
        print(f"lockstep: internal error: {located(e)}" + ("" if args.debug else "; --debug shows the traceback"),
              file=sys.stderr)
        return EXIT_MISMATCH


def _in_world(args) -> int:
    """args.func(args); where torchrun started this process, as a rank of its world
    (lockstep.engine.world): rank 0 runs the command and reports, the others serve its topologies."""
    from lockstep.engine.world import started_by_torchrun
    if not started_by_torchrun():
        return args.func(args)
    from lockstep.engine import world
    rank, _ = world.join()
    if rank != 0:
        return world.serve()
    try:
        return args.func(args)
    finally:
        world.finish()


# Modules whose pip package has another name; any other third-party module is its own package's name.
PACKAGES = {"yaml": "pyyaml", "packaging": "packaging"}
OWN_PACKAGES = ("harness", "engine", "kernels", "models", "tests")


def _missing_package(e: ModuleNotFoundError) -> str | None:
    """The pip package behind a missing module; None for one of Lockstep's own (an internal error)."""
    top = (e.name or "").split(".")[0]
    if not top or top in OWN_PACKAGES:
        return None
    return PACKAGES.get(top, top)


def _stdout_closed() -> int:
    """The reader went away (`lockstep list | head -1`): stop quietly. Point stdout at /dev/null so
    the interpreter's final flush does not complain, and exit as a SIGPIPE-killed tool would."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout replaced by one without a file descriptor
        pass
    return EXIT_STDOUT_CLOSED


if __name__ == "__main__":
    sys.exit(main())
