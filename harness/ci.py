"""Is this run under CI? Any truthy `CI` value (GitHub Actions, GitLab and most runners set
CI=true; others CI=1 or CI=yes) — goldens are then never written without an explicit override."""

from __future__ import annotations

import os

FALSY = ("", "0", "false", "no", "off", "n", "f")


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in FALSY


def ci_value() -> str:
    return os.environ.get("CI", "")
