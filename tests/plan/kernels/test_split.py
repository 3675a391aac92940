"""``--oversize split``: pieces tile their documents, respect the budget, never share a
micro-batch, and ``validate`` passes a split plan and catches a removed, overlapping or shifted
piece."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from varpack.errors import ConfigError
from varpack.plan import PlanConfig, make_plan
from varpack.plan.kernels.pack import PackRule, pack
from varpack.plan.kernels.split import fit_len, split_units
from varpack.plan.oversize import preview
from varpack.planfile.format import Plan, load_plan, write_plan
from varpack.planfile.rankrows import RankRows
from varpack.planfile.report import Report
from varpack.planfile.tables import plan_tables
from varpack.validate import validate_plan
from varpack.validate.pieces import check_apart


def _sorted(lens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    lens_a = np.array(lens, dtype=np.int64)
    ids = np.arange(len(lens_a), dtype=np.int64) * 5 + 2
    order = np.lexsort((ids, lens_a))
    return ids[order], lens_a[order]


def test_split_units_merge_is_the_full_sort(rng):
    lens = rng.integers(1, 100, 3000)
    ids = rng.permutation(10**6)[:3000]
    order = np.lexsort((ids, lens))
    ids, lens = ids[order], lens[order]
    u = split_units(ids, lens, 17)
    assert u is not None
    want = np.lexsort((u.offsets, u.ids, u.lens))
    assert np.array_equal(want, np.arange(len(want)))
    assert split_units(ids, lens, 1000) is None
    # every document's pieces tile it
    o = np.lexsort((u.offsets, u.ids))
    ends = np.zeros(10**6, np.int64)
    np.add.at(ends, u.ids, u.lens)
    assert np.array_equal(ends[ids], lens)
    assert (u.lens <= 17).all() and ((u.group >= 0) == (lens.max() > 0))[0]
    assert ((u.group >= 0) == np.isin(u.ids, ids[lens > 17])).all()
    same = u.ids[o][1:] == u.ids[o][:-1]
    assert np.array_equal(u.offsets[o][1:][same], (u.offsets[o] + u.lens[o])[:-1][same])


@pytest.mark.parametrize("cap", [0, 4])
def test_pack_keeps_pieces_apart(cap):
    lens = np.array([3] * 12)
    group = np.array([0, 0, 0, 1, 1, 1, -1, -1, 2, 2, 3, 3])
    _, free = pack(lens, np.array([0, 12]), np.zeros(12, bool), PackRule(max_tokens=40), cap)
    assert len(free) == 2  # without groups everything shares one micro-batch
    perm, off = pack(
        lens, np.array([0, 12]), np.zeros(12, bool), PackRule(max_tokens=40), cap, group
    )
    g = group if perm is None else group[perm]
    for a, b in zip(off[:-1], off[1:], strict=True):
        pieces = g[a:b][g[a:b] >= 0]
        assert len(pieces) == len(set(pieces.tolist()))


def _units_of(tables: list[pa.Table]) -> tuple[np.ndarray, ...]:
    """Per planned unit: id, offset, length, step, and (rank, row) as one micro-batch key."""
    out: list[list[np.ndarray]] = [[], [], [], [], []]
    for r, t in enumerate(tables):
        counts = np.diff(t.column("sample_ids").combine_chunks().offsets.to_numpy())
        out[0].append(t.column("sample_ids").combine_chunks().flatten().to_numpy())
        out[1].append(t.column("sample_offsets").combine_chunks().flatten().to_numpy())
        out[2].append(t.column("seq_lens").combine_chunks().flatten().to_numpy())
        out[3].append(np.repeat(t.column("step").to_numpy(), counts))
        out[4].append(np.repeat(np.arange(t.num_rows) + r * 10**7, counts))
    return tuple(np.concatenate(x).astype(np.int64) for x in out)


configs = st.fixed_dictionaries(
    {
        "budget": st.integers(4, 300),
        "layout": st.sampled_from(["packed", "padded"]),
        "pad_multiple": st.sampled_from([1, 1, 4]),
        "split_frac": st.sampled_from([None, 0.1, 0.5, 1.0]),
        "dp": st.integers(1, 3),
        "grad_accum": st.integers(1, 2),
        "order": st.sampled_from(["curriculum", "shuffle"]),
        "epochs": st.integers(1, 2),
        "warmup": st.sampled_from(["list", "reorder"]),
        "max_shapes": st.sampled_from([None, None, 2]),
        "positions": st.sampled_from(["restart", "continue"]),
    }
)


@settings(max_examples=50, deadline=None)
@given(lens=st.lists(st.integers(1, 1000), min_size=1, max_size=80), c=configs)
@example(  # --max-shapes over pieces, reordered across epochs: a piece is (id, offset)
    lens=[5],
    c={"budget": 4, "layout": "padded", "pad_multiple": 1, "split_frac": None, "dp": 1,
       "grad_accum": 1, "order": "curriculum", "epochs": 2, "warmup": "reorder",
       "max_shapes": 2, "positions": "restart"},
)  # fmt: skip
def test_property_pieces_tile_fit_and_stay_apart(lens, c):
    ids, lens_a = _sorted(lens)
    budget = max(c["budget"], c["pad_multiple"])
    top = fit_len(budget, c["pad_multiple"])
    split_len = None if c["split_frac"] is None else max(1, int(top * c["split_frac"]))
    cfg = PlanConfig(
        max_tokens=budget,
        layout=c["layout"],
        pad_multiple=c["pad_multiple"],
        oversize="split",
        split_len=split_len,
        split_positions=c["positions"],
        dp=c["dp"],
        grad_accum=c["grad_accum"],
        order=c["order"],
        epochs=c["epochs"],
        warmup=c["warmup"],
        max_shapes=c["max_shapes"],
    )
    try:
        arrays, meta, extra = make_plan(ids, lens_a, cfg)
    except ConfigError as exc:
        assert "cannot fill one step" in str(exc) or "cannot be split" in str(exc), str(exc)
        return
    s = split_len or top
    tables = list(plan_tables(arrays))
    uid, uoff, ulen, ustep, umicro = _units_of(tables)
    # pieces respect the split length and the budget
    assert ulen.max() <= s
    vol = arrays.micro.pad_to * (arrays.micro.rows if cfg.layout == "padded" else 1)
    assert vol.max() <= budget
    # pieces of one document never share a micro-batch
    key = np.lexsort((uid, umicro))
    assert not ((uid[key][1:] == uid[key][:-1]) & (umicro[key][1:] == umicro[key][:-1])).any()
    # every token of every document exactly once per epoch (over the whole plan: epochs times)
    cover = {int(i): np.zeros(int(n), np.int64) for i, n in zip(ids, lens_a, strict=True)}
    for i, o, n in zip(uid, uoff, ulen, strict=True):
        cover[int(i)][o : o + n] += 1
    assert all((v == cfg.epochs).all() for v in cover.values())
    assert meta["stats"]["tokens"]["kept_share"] == 1.0
    assert meta["stats"]["tokens"]["split"] == int(lens_a[lens_a > s].sum())
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan"
        write_plan(out, meta, tables, rank_extra=extra)
        report = validate_plan(out, (ids, lens_a), replay=True)
        assert report.problems == []
        assert report.facts["tokens"] == meta["stats"]["tokens"]


# ---- tamper: validate catches a removed, overlapping or shifted piece ---------------------------


@pytest.fixture(scope="module")
def split_plan(tmp_path_factory):
    ids, lens = _sorted([3, 40, 7, 95, 12, 61, 5])
    cfg = PlanConfig(max_tokens=64, oversize="split", split_len=20, dp=1)
    arrays, meta, extra = make_plan(ids, lens, cfg)
    out = tmp_path_factory.mktemp("split") / "plan"
    write_plan(out, meta, plan_tables(arrays), rank_extra=extra)
    return out, (ids, lens)


def _tampered(src: Path, dst: Path, edit) -> Path:
    """The plan rewritten with ``edit(ids, offs, lens) -> (ids, offs, lens)`` on rank 0's flat
    lists (row boundaries kept where lengths allow), checksums and fingerprint made to fit."""
    plan = load_plan(src)
    t = Plan(src, plan.meta).rank_table(0)
    col = t.column("sample_ids").combine_chunks()
    off = col.offsets.to_numpy()
    ids = col.flatten().to_numpy().copy()
    offs = t.column("sample_offsets").combine_chunks().flatten().to_numpy().copy()
    lens = t.column("seq_lens").combine_chunks().flatten().to_numpy().copy()
    off, ids, offs, lens = edit(off.copy(), ids, offs, lens)
    o32 = pa.array(off.astype(np.int32))
    cols = {n: t.column(n) for n in t.column_names}
    cols["sample_ids"] = pa.ListArray.from_arrays(o32, pa.array(ids, pa.int64()))
    cols["sample_offsets"] = pa.ListArray.from_arrays(o32, pa.array(offs, pa.int64()))
    cols["seq_lens"] = pa.ListArray.from_arrays(o32, pa.array(lens.astype(np.int32)))
    meta = {k: v for k, v in plan.meta.items() if k not in ("format", "version", "ranks")}
    meta.pop("plan_fingerprint", None)
    extra = [{"shapes": r.get("shapes", [])} for r in plan.meta["ranks"]]
    write_plan(dst, meta, [pa.table(cols, schema=t.schema)], rank_extra=extra)
    return dst


def _piece(ids, offs, want_offset):
    """Position of a piece of the 95-token document (id 17) at ``want_offset``."""
    return int(np.flatnonzero((ids == 17) & (offs == want_offset))[0])


def test_tamper_shifted_piece(split_plan, tmp_path):
    src, meta_arrays = split_plan

    def shift(off, ids, offs, lens):
        offs[_piece(ids, offs, 40)] = 41
        return off, ids, offs, lens

    report = validate_plan(_tampered(src, tmp_path / "p", shift), meta_arrays)
    text = "\n".join(report.problems)
    assert "sample_id 17 offset 41: a gap: tokens 40..41 are in no piece" in text


def test_tamper_overlapping_piece(split_plan, tmp_path):
    src, meta_arrays = split_plan

    def overlap(off, ids, offs, lens):
        offs[_piece(ids, offs, 60)] = 50
        return off, ids, offs, lens

    report = validate_plan(_tampered(src, tmp_path / "p", overlap), meta_arrays)
    text = "\n".join(report.problems)
    assert "sample_id 17 offset 50: overlaps the piece before it, which ends at token 60" in text


def test_tamper_removed_piece(split_plan, tmp_path):
    src, meta_arrays = split_plan

    def remove(off, ids, offs, lens):  # the last piece, 15 tokens, shares its row
        k = _piece(ids, offs, 80)
        off[np.searchsorted(off, k, side="right") :] -= 1
        keep = np.arange(len(ids)) != k
        return off, ids[keep], offs[keep], lens[keep]

    bad = _tampered(src, tmp_path / "p", remove)
    text = "\n".join(validate_plan(bad, meta_arrays).problems)
    assert "epoch 0: seq_len differs from the metadata for sample ids: 17" in text
    assert "do not match the input fingerprint" in text
    assert "do not match the input fingerprint" in "\n".join(validate_plan(bad).problems)


def test_untampered_plan_passes_and_reports_shares(split_plan, tmp_path):
    src, meta_arrays = split_plan
    same = _tampered(src, tmp_path / "p", lambda *a: a)
    report = validate_plan(same, meta_arrays, replay=True)
    assert report.problems == []
    t = report.facts["tokens"]
    total = int(meta_arrays[1].sum())
    assert (t["kept"], t["dropped"], t["split"]) == (total, 0, 40 + 95 + 61)
    assert (t["documents_split"], t["pieces"]) == (3, 2 + 5 + 4)
    assert t["split_share"] == pytest.approx(196 / total)


def test_check_apart_names_the_pieces():
    rk = RankRows(
        step=np.array([0, 1]),
        micro=np.array([0, 0]),
        offsets=np.array([0, 3, 4]),
        ids=np.array([9, 4, 9, 4]),
        lens=np.array([5, 5, 5, 5]),
        table=pa.table({"x": [1]}),
        pad_rows=np.zeros(2, np.int64),
        block_index=None,
        warmup=np.zeros(2, bool),
        sample_offsets=np.array([0, 0, 5, 5]),
    )
    report = Report()
    check_apart([rk], report)
    assert report.problems == [
        "rank 0 step 0 row 0: pieces of sample_id 9 at offsets 0 and 5 share a micro-batch"
    ]


def test_preview_counts():
    p = preview(np.array([5, 10, 11, 40, 100]), 10)
    assert p["oversize"] == {"documents": 3, "tokens": 151, "share": 151 / 166}
    assert p["split"]["pieces"] == 2 + 4 + 10
    assert p["alone"] == {"micro_batches": 3, "largest": 100, "above_warning": 2, "above_bound": 1}
    assert preview(np.array([5, 40]), 10, split_len=5)["split"]["documents"] == 1
