"""What a replay's verdict cannot see by itself, said beside it: the trace was recorded by other
code (another lockstep revision: a re-run of "the trace's side" runs today's code, so a divergence
that the code change caused does not reproduce there), or the replay runs another backend than the
recording (torch and triton keep separate goldens: they are not expected to agree bitwise)."""

from __future__ import annotations

from lockstep.harness.platform import lockstep_revision


def _base(revision: str) -> str:
    return revision.removesuffix("+dirty")


def replay_notes(manifest: dict, setup, here_revision: str | None = None) -> list[str]:
    notes = []
    engine = manifest.get("engine") or {}
    recorded = engine.get("revision") if engine.get("name") == "lockstep" else None
    here = here_revision if here_revision is not None else lockstep_revision()
    if isinstance(recorded, str) and recorded != "unknown" and here != "unknown" and recorded != here:
        same = _base(recorded) == _base(here)
        notes.append(f"the trace was recorded at lockstep {recorded}, this replay runs {here}"
                     + (" (uncommitted changes on one side)" if same else "")
                     + ": verdicts compare this code's bits with the recorded ones, and the locator re-runs both "
                       "sides with this code, so a divergence that the code change caused shows there as "
                       "'did not reproduce on the re-run'")
    recorded_backend = (manifest.get("settings") or {}).get("backend")
    if recorded_backend and getattr(setup, "backend", recorded_backend) != recorded_backend:
        notes.append(f"the trace was recorded with the {recorded_backend} backend and replays with "
                     f"{setup.backend}: the two backends keep separate goldens and are not expected to agree "
                     "bitwise, so a difference here says where they part, not that either is wrong")
    return notes
