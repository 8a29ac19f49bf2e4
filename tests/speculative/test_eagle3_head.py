"""The EAGLE3 draft head: fc-input norms, d2t, checkpoint layout and load-time errors, row bits."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lockstep.engine.boundaries import LayerIdError
from lockstep.engine.checkpoint import CheckpointError, checkpoint_digest
from lockstep.engine.config import preset
from lockstep.engine.eagle3 import DraftKV, Eagle3Config, Eagle3Draft, load_draft, make_draft_checkpoint
from lockstep.kernels.matmul import linear_portable as linear
from lockstep.kernels.rmsnorm import rms_norm_portable as rms_norm

TINY = preset("tiny")
IDS = [1, 2, 4]            # max == L = 4: boundaries [1, 2, 4] under sglang and boundary


def rows(n, width, seed):
    return torch.randn(n, width, generator=torch.Generator().manual_seed(seed)) * 3 + 0.5


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """One draft with norm_before_fc and fc_norm; the other variants drop tensors from it."""
    path = make_draft_checkpoint("tiny", 5, tmp_path_factory.mktemp("d") / "both", aux_layer_ids=IDS,
                                 norm_before_fc=True, fc_norm=True)
    cfg = json.loads((path / "config.json").read_text())
    return path, cfg, load_file(str(path / "model.safetensors"))


def variant(both, norm_before_fc, fc_norm):
    _, d, weights = both
    d = json.loads(json.dumps(d))
    d["eagle_config"]["norm_before_fc"] = norm_before_fc
    d["fc_norm"] = fc_norm
    w = {k: v for k, v in weights.items()
         if (norm_before_fc or k != "input_norm.weight") and (fc_norm or not k.startswith("fc_norm."))}
    return Eagle3Draft(Eagle3Config.from_hf_dict(d), w, TINY, "sglang")


def test_fc_input_norms_are_different_specified_ops(both):
    aux = rows(5, 3 * 96, 0)
    fc = load_file(str(both[0] / "model.safetensors"))
    f32 = {k: v.float() for k, v in fc.items()}
    eps = 1e-5
    whole = rms_norm(aux, f32["input_norm.weight"], eps)                       # one norm over all 288
    per_chunk = lambda x: torch.cat([rms_norm(c, f32[f"fc_norm.{i}.weight"], eps)   # noqa: E731
                                     for i, c in enumerate(x.chunk(3, dim=-1))], -1)
    expect = {(False, False): aux, (True, False): whole, (False, True): per_chunk(aux), (True, True): per_chunk(whole)}
    got = {}
    for (nbf, fcn), x in expect.items():
        got[nbf, fcn] = variant(both, nbf, fcn).combine_aux(aux)
        assert got[nbf, fcn].equal(linear(x, f32["fc.weight"]))
    keys = list(got)
    for i in range(4):
        for j in range(i + 1, 4):
            assert (got[keys[i]] - got[keys[j]]).abs().max() > 1e-2, (keys[i], keys[j])


def test_norm_before_fc_changes_what_the_draft_predicts(both):
    with_norm, without = variant(both, True, False), variant(both, False, False)
    aux = rows(6, 3 * 96, 1)
    toks, pos = torch.arange(6) + 10, torch.arange(6)
    outs = []
    for d in (with_norm, without):
        kv = DraftKV(d.config, 1, 32)
        outs.append(d.forward(toks, pos, d.combine_aux(aux), kv, torch.zeros(6, dtype=torch.int64), commit=True))
    assert not torch.equal(outs[0].logits.argmax(-1), outs[1].logits.argmax(-1))


def test_norm_before_fc_read_from_eagle_config_then_top_level():
    base = dict(hidden_size=8, intermediate_size=8, num_attention_heads=2, vocab_size=16)
    assert Eagle3Config.from_hf_dict({**base, "eagle_config": {"norm_before_fc": True}}).norm_before_fc
    assert Eagle3Config.from_hf_dict({**base, "norm_before_fc": True}).norm_before_fc
    assert not Eagle3Config.from_hf_dict({**base, "norm_before_fc": True,
                                          "eagle_config": {"norm_before_fc": False}}).norm_before_fc
    assert Eagle3Config.from_hf_dict({**base, "use_aux_norm": True}).fc_norm
    with pytest.raises(ValueError, match="norm_before_fc: must be a bool"):
        Eagle3Config.from_hf_dict({**base, "norm_before_fc": "yes"})


def test_norm_before_fc_weights_must_match_the_flag(both, tmp_path):
    _, d, w = both
    with pytest.raises(CheckpointError, match="norm_before_fc is true but input_norm.weight is missing"):
        Eagle3Draft(Eagle3Config.from_hf_dict(d), {k: v for k, v in w.items() if k != "input_norm.weight"},
                    TINY, "sglang")
    d2 = json.loads(json.dumps(d))
    d2["eagle_config"]["norm_before_fc"] = False
    with pytest.raises(CheckpointError, match="input_norm.weight is present but norm_before_fc is false"):
        Eagle3Draft(Eagle3Config.from_hf_dict(d2), w, TINY, "sglang")


def test_d2t_maps_draft_ids_to_target_ids(both):
    draft = variant(both, True, True)
    d2t = both[2]["d2t"]
    ids = torch.tensor([0, 1, 7, 255])
    assert draft.to_target_ids(ids).tolist() == [int(i + d2t[i]) for i in ids]
    assert draft.hot_ids.tolist() == sorted(draft.hot_ids.tolist())        # a sorted subset, as SpecForge makes
    assert int(d2t.abs().sum()) > 0                                         # not the identity
    t2d = both[2]["t2d"]
    assert t2d.nonzero()[:, 0].tolist() == draft.hot_ids.tolist()
    _, d, w = both
    bad = dict(w, d2t=w["d2t"].clone())
    bad["d2t"][3] = 600
    with pytest.raises(CheckpointError, match="d2t maps draft id 3 to target id 603"):
        Eagle3Draft(Eagle3Config.from_hf_dict(d), bad, TINY, "sglang")


def test_make_draft_checkpoint_is_deterministic_and_loads_both_namings(tmp_path):
    a = make_draft_checkpoint("tiny", 3, tmp_path / "a", aux_layer_ids=IDS, norm_before_fc=True)
    b = make_draft_checkpoint("tiny", 3, tmp_path / "b", aux_layer_ids=IDS, norm_before_fc=True)
    assert checkpoint_digest(a) == checkpoint_digest(b)
    with pytest.raises(FileExistsError):
        make_draft_checkpoint("tiny", 3, a, aux_layer_ids=IDS)
    assert not list(tmp_path.glob("*.tmp-*"))
    names = set(load_file(str(a / "model.safetensors")))
    assert {"fc.weight", "input_norm.weight", "midlayer.hidden_norm.weight", "midlayer.self_attn.q_proj.weight",
            "norm.weight", "lm_head.weight", "d2t", "t2d", "embed_tokens.weight"} <= names
    # vLLM / ModelOpt style `layers.0.` instead of `midlayer.`; ids at the top level
    w = {k.replace("midlayer.", "layers.0."): v for k, v in load_file(str(a / "model.safetensors")).items()}
    c = tmp_path / "c"
    c.mkdir()
    save_file(w, str(c / "model.safetensors"))
    d = json.loads((a / "config.json").read_text())
    d["eagle_aux_hidden_state_layer_ids"] = d["eagle_config"].pop("eagle_aux_hidden_state_layer_ids")
    (c / "config.json").write_text(json.dumps(d))
    x, y = load_draft(a, TINY, convention="sglang"), load_draft(c, TINY, convention="sglang")
    assert x.boundaries == y.boundaries == [1, 2, 4]
    assert x.q_w.equal(y.q_w)


def test_load_time_errors_name_the_config(tmp_path):
    p = make_draft_checkpoint("tiny", 0, tmp_path / "two", aux_layer_ids=[1, 4], n_aux=3)
    with pytest.raises(LayerIdError) as err:
        load_draft(p, TINY, convention="sglang")
    for part in (str(p), "'sglang'", "[1, 4]", "L=4", "expects 3 aux states"):
        assert part in str(err.value)
    p = make_draft_checkpoint("tiny", 0, tmp_path / "oi", aux_layer_ids=[1, 2, 4])
    with pytest.raises(LayerIdError, match=r"\[5\] are outside \[0, 4\]"):
        load_draft(p, TINY, convention="output-index")
    with pytest.raises(ValueError, match="vocab_size=512 but the target's vocab_size is 1024"):
        load_draft(p, TINY.replace(vocab_size=1024), convention="sglang")
    with pytest.raises(ValueError, match="target_hidden_size=96 but the target's hidden_size is 160"):
        load_draft(p, preset("small"), convention="sglang")


def test_tree_rows_equal_committed_rows_bit_for_bit(both):
    """A row at position p sees the same keys whether committed (extend) or as a tree node."""
    draft = variant(both, True, False)
    aux = rows(7, 3 * 96, 2)
    toks = torch.tensor([5, 9, 11, 40, 3, 77, 2])
    kv = DraftKV(draft.config, 2, 32)
    full = draft.forward(toks, torch.arange(7), draft.combine_aux(aux), kv, torch.zeros(7, dtype=torch.int64),
                         commit=True)
    # slot 1: commit 4 rows, then rows 4, 5, 6 as a chain of tree nodes (ancestors passed explicitly)
    draft.forward(toks[:4], torch.arange(4), draft.combine_aux(aux[:4]), kv, torch.ones(4, dtype=torch.int64),
                  commit=True)
    anc = []
    h = draft.combine_aux(aux)
    for p in (4, 5, 6):
        st = draft.forward(toks[p:p + 1], torch.tensor([p]), h[p:p + 1], kv, torch.tensor([1]), commit=False,
                           prefix_lens=[4], ancestors=[list(anc)])
        assert st.logits[0].equal(full.logits[p]) and st.hidden[0].equal(full.hidden[p])
        anc.append((st.k[0], st.v[0]))
    # batch invariance: the same rows alone give the same bits
    kv2 = DraftKV(draft.config, 1, 64)
    alone = draft.forward(toks, torch.arange(7), h, kv2, torch.zeros(7, dtype=torch.int64), commit=True)
    assert alone.logits.equal(full.logits)


# --------------------------------------------------------------------------- the cached path (bf16 policy)
def bf16_variant(both):
    _, d, weights = both
    return Eagle3Draft(Eagle3Config.from_hf_dict(d), weights, TINY, "sglang", dtype="bf16")


def test_cached_path_tree_rows_equal_committed_rows_bit_for_bit(both):
    """On the cached path a tree row writes its ancestors and itself after the committed prefix of
    its slot and attends there: the same bits as the committed row at that position, and as the
    same rows alone (batch invariance)."""
    draft = bf16_variant(both)
    assert draft.cached and draft.qkv_w.dtype == torch.bfloat16
    aux = rows(7, 3 * 96, 2)
    toks = torch.tensor([5, 9, 11, 40, 3, 77, 2])
    h = draft.combine_aux(aux)
    kv = draft.new_kv(3, 32)
    full = draft.forward(toks, torch.arange(7), h, kv, torch.zeros(7, dtype=torch.int64), commit=True)
    draft.forward(toks[:4], torch.arange(4), h[:4], kv, torch.ones(4, dtype=torch.int64), commit=True)
    anc = []
    for p in (4, 5, 6):
        st = draft.forward(toks[p:p + 1], torch.tensor([p]), h[p:p + 1], kv, torch.tensor([1]), commit=False,
                           prefix_lens=[4], ancestors=[list(anc)])
        assert st.logits.dtype == torch.float32 and st.hidden.dtype == torch.bfloat16
        assert st.logits[0].equal(full.logits[p]) and st.hidden[0].equal(full.hidden[p]), p
        anc.append((st.k[0], st.v[0]))
    # a slot whose tail holds stale tree keys of another row: the ancestors passed are what count
    kv.k[2], kv.v[2] = kv.k[1].clone(), kv.v[1].clone()
    kv.k[2, :, 4:].normal_()
    st = draft.forward(toks[6:7], torch.tensor([6]), h[6:7], kv, torch.tensor([2]), commit=False,
                       prefix_lens=[4], ancestors=[list(anc[:2])])
    assert st.logits[0].equal(full.logits[6])
    alone = draft.forward(toks, torch.arange(7), h, draft.new_kv(1, 64), torch.zeros(7, dtype=torch.int64),
                          commit=True)
    assert alone.logits.equal(full.logits)


def test_cached_path_computes_what_the_reference_computes(both):
    """bf16 rounding apart, the cached path is the portable head's computation: a head that
    attended to the wrong keys, dropped a norm or mixed q/k/v up would be far off."""
    _, d, weights = both
    ref = Eagle3Draft(Eagle3Config.from_hf_dict(d), weights, TINY, "sglang")
    fast = bf16_variant(both)
    aux = rows(7, 3 * 96, 4)
    toks = torch.tensor([5, 9, 11, 40, 3, 77, 2])
    slots = torch.zeros(7, dtype=torch.int64)
    a = ref.forward(toks, torch.arange(7), ref.combine_aux(aux), DraftKV(ref.config, 1, 32), slots, commit=True)
    b = fast.forward(toks, torch.arange(7), fast.combine_aux(aux), fast.new_kv(1, 32), slots, commit=True)
    rel = (a.logits - b.logits).norm() / a.logits.norm()
    assert rel < 0.05, rel
    spread = (a.logits - a.logits.roll(1, 0)).norm() / a.logits.norm()       # what a wrong row would give
    assert spread > 0.5, spread
    assert (a.logits.argmax(-1) == b.logits.argmax(-1)).float().mean() >= 5 / 7
