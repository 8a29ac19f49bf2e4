"""A replay says when the trace was recorded by other code or another backend (its verdicts
cannot tell those apart from a bug)."""

from types import SimpleNamespace

from lockstep.harness.replay.context import replay_notes

MANIFEST = {"engine": {"name": "lockstep", "revision": "aaaaaaaaaaaa"}, "settings": {"backend": "torch"}}


def test_same_revision_and_backend_say_nothing():
    assert replay_notes(MANIFEST, SimpleNamespace(backend="torch"), "aaaaaaaaaaaa") == []


def test_another_revision_is_named_with_what_it_means_for_the_locator():
    (note,) = replay_notes(MANIFEST, SimpleNamespace(backend="torch"), "bbbbbbbbbbbb")
    assert "recorded at lockstep aaaaaaaaaaaa, this replay runs bbbbbbbbbbbb" in note
    assert "did not reproduce on the re-run" in note
    (note,) = replay_notes(MANIFEST, SimpleNamespace(backend="torch"), "aaaaaaaaaaaa+dirty")
    assert "uncommitted changes" in note


def test_another_backend_is_not_expected_to_agree_bitwise():
    (note,) = replay_notes(MANIFEST, SimpleNamespace(backend="triton"), "aaaaaaaaaaaa")
    assert "torch backend and replays with triton" in note and "not expected to agree bitwise" in note


def test_a_peer_trace_has_no_revision_note():
    peer = {"engine": {"name": "vllm"}, "settings": {"backend": "torch"}}
    assert replay_notes(peer, SimpleNamespace(backend="torch"), "bbbbbbbbbbbb") == []
