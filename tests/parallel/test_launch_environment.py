"""A forked rank takes the launching process's environment as it is at the call, not the fork
server's (started at the first launch, with the environment of then); beside it, the planted fault
(the rank handed the server's environment) turns the pin red. The rank's own half (`_rank_main`
replacing its environment) runs in a fresh process no monkeypatch reaches: it is pinned by the same
pin, and a fault there is shown by editing engine/launch.py (tests/planted.py's docstring)."""

from __future__ import annotations

import pytest

from lockstep.engine import launch as launch_mod
from tests.deadline import deadline
from tests.parallel import rank_fns

PROBE = "LOCKSTEP_LAUNCH_ENV_PROBE"


def pin_rank_environment(monkeypatch) -> None:
    monkeypatch.delenv(PROBE, raising=False)
    with deadline(300):                         # a rank that cannot start fails the test, never hangs it
        launch_mod.launch(rank_fns.gather_ranks, 1, args=("the server is started",), timeout_s=120)
        assert launch_mod.launch(rank_fns.environment_and_patch, 2, args=(PROBE,), timeout_s=120)[0][0] is None
        monkeypatch.setenv(PROBE, "set after the server started")
        res = launch_mod.launch(rank_fns.environment_and_patch, 2, args=(PROBE,), timeout_s=120)
    assert [v for v, _ in res] == ["set after the server started"] * 2, res


def test_rank_environment(monkeypatch):
    pin_rank_environment(monkeypatch)


def test_rank_environment_planted(monkeypatch):
    """The plant: the ranks get the environment without what was set after the server started
    (the fork server's own), through the one `dict(os.environ)` launch hands them."""
    monkeypatch.setattr(launch_mod, "dict", lambda env: {k: v for k, v in env.items() if k != PROBE}, raising=False)
    with pytest.raises(AssertionError):
        pin_rank_environment(monkeypatch)
