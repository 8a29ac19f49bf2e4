"""Ranks started by torchrun (engine.world): `lockstep check` as ranks of its world, on one node
and as two nodes (two torchrun agents on 127.0.0.1), every topology the world can hold run and
green against the goldens Lockstep's own launcher passes; the others listed as not run. On the
CPU (gloo), loopback only, every run bounded by a timeout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO

TIMEOUT_S = 400


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "LOCKSTEP_COLLECTIVE_TIMEOUT": "120"}
    env.pop("LOCKSTEP_TRANSPORT", None)
    return env


def _torchrun(*args: str, nodes: str | None = None) -> list[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run"]
    where = ["--standalone"] if nodes is None else nodes.split()
    return launcher + where + list(args)


def _check(*specs: str) -> list[str]:
    return ["-m", "lockstep", "check", *specs, "--dtype", "fp32", "--backend", "torch", "--json"]


def _report(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{"):])


def test_check_on_one_node_runs_the_topologies_of_its_world():
    out = subprocess.run(_torchrun("--nproc-per-node", "2", *_check("topology/tensor-parallel", "topology/expert-parallel")),
                         cwd=REPO, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    report = _report(out.stdout)
    assert [s["status"] for s in report["specs"]] == ["pass", "pass"]
    notes = [n for s in report["specs"] for n in s["notes"]]
    assert "checked at topology tp=1 ep=2" in notes and "checked at topology tp=2 ep=1" in notes
    assert any(n.startswith("not run at tp=4 ep=1: needs 4 ranks, torchrun's world has 2") for n in notes)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_check_on_two_nodes_of_one_rank_each():
    """Two torchrun agents, node ranks 0 and 1, meeting at a c10d rendezvous on 127.0.0.1."""
    port = _free_port()
    nodes = f"--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port} --rdzv-id lockstep-test"
    cmd = lambda node: _torchrun(*_check("topology/tensor-parallel"), nodes=f"{nodes} --node-rank {node}")  # noqa: E731
    agents = [subprocess.Popen(cmd(n), cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for n in (0, 1)]
    try:
        outs = [a.communicate(timeout=TIMEOUT_S) for a in agents]
    finally:
        for a in agents:
            a.kill()
    assert [a.returncode for a in agents] == [0, 0], [e[-3000:] for _, e in outs]
    reports = [o for o, _ in outs if "{" in o]
    assert len(reports) == 1                                        # rank 0 reports, rank 1 serves
    spec = _report(reports[0])["specs"][0]
    assert spec["status"] == "pass" and "checked at topology tp=2 ep=1" in spec["notes"]


@pytest.mark.parametrize("mode, same", [("clean", True), ("planted", False)])
def test_the_world_computes_the_split_and_a_wrong_order_shows(par_ckpt, mode, same):
    """The served ranks do their share: with a wrong order of the partials in every rank the bits
    leave the one-device model's."""
    out = subprocess.run(_torchrun("--nproc-per-node", "2", "tests/parallel/torchrun_rank.py", par_ckpt, mode),
                         cwd=REPO, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"world": 2, "same": same}


def test_replay_spreads_over_the_world_and_rank_0_alone_reports(tmp_path, capsys):
    """`lockstep replay` under torchrun (2 ranks): the requests spread over the world (the
    heartbeat says so on stderr), and stdout holds one document, the one one process prints."""
    from lockstep.harness.cli import main
    from lockstep.harness.replay.format import read_trace, write_trace
    trace = tmp_path / "t.jsonl"
    assert main(["record", str(trace), "--checkpoint", "models/tiny-target", "--max-new-tokens", "3", "--seed", "5",
                 "--prompt-ids", "3,5,7", "--prompt-ids", "20,21,22,23", "--prompt-ids", "9,300"]) == 0
    t = read_trace(trace)
    t.steps[2][1]["token"] = (t.steps[2][1]["token"] + 1) % 500         # request 2 diverges at step 1
    write_trace(t, trace)
    capsys.readouterr()
    assert main(["replay", str(trace), "--json", "--no-locate"]) == 1
    want = capsys.readouterr().out
    out = subprocess.run(_torchrun("--nproc-per-node", "2", "-m", "lockstep", "replay", str(trace), "--json",
                                   "--no-locate"),
                         cwd=REPO, env={**_env(), "LOCKSTEP_PROGRESS_SECONDS": "0.01"}, capture_output=True,
                         text=True, timeout=TIMEOUT_S)
    assert out.returncode != 0 and "2 data-parallel ranks" in out.stderr, out.stderr[-3000:]
    assert out.stdout == want
