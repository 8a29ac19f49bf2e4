"""`lockstep make-checkpoint`: a synthetic checkpoint in the HF layout, its size said (and
bounded by --max-gb) before anything is made."""

from __future__ import annotations

from pathlib import Path

import torch

from lockstep.engine.checkpoint import make_checkpoint
from lockstep.harness.commands.exits import EXIT_OK
from lockstep.harness.errors import UsageError, write_failure
from lockstep.harness.estimates import CheckpointProgress, checkpoint_size
from lockstep.harness.jsonout import print_document, tool_document


def cmd_make_checkpoint(args) -> int:
    device = getattr(args, "device", "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA GPU here")
    size, count = checkpoint_size(args)        # refused above --max-gb before anything is made
    try:
        out = make_checkpoint(args.preset, args.seed, args.format, args.out, overwrite=args.overwrite,
                              progress=CheckpointProgress(), device=device)
    except FileExistsError:
        raise UsageError(f"{args.out} exists and is not empty; use --overwrite to replace it") from None
    except ValueError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot write {args.out}: {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001 - safetensors' own error for a full or read-only disk
        if write_failure(e) is None:
            raise
        raise UsageError(f"cannot write {args.out}: {write_failure(e)}") from None
    if args.json:
        files = sorted(f.name for f in Path(out).iterdir() if f.is_file())
        print_document(tool_document("make-checkpoint", True, path=str(out), preset=args.preset, seed=args.seed,
                                     format=args.format, tensors=count, parameter_bytes=size, files=files))
    else:
        print(f"wrote {args.format} checkpoint of preset {args.preset!r} (seed {args.seed}) to {out}")
    return EXIT_OK
