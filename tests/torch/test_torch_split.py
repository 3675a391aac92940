"""The reader on a split plan: every piece is the slice of its document's tokens, positions
restart or continue as plan.json says, and no label crosses a piece boundary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.nn")

from plan_helpers import write_tokens  # noqa: E402

from varpack.errors import InputError  # noqa: E402
from varpack.metadata.lengths import write_arrow_tokens  # noqa: E402
from varpack.plan import PlanConfig, make_plan  # noqa: E402
from varpack.planfile.format import write_plan  # noqa: E402
from varpack.planfile.tables import plan_tables  # noqa: E402
from varpack.torch import ParquetTokenDataset, PlanLoader  # noqa: E402
from varpack.torch.batch import IGNORE_INDEX  # noqa: E402
from varpack.torch.dataset import fetch_flat  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, np.ndarray, np.ndarray, dict[int, np.ndarray]]:
    root = tmp_path_factory.mktemp("split-tokens")
    rng = np.random.default_rng(3)
    ids = rng.choice(10**5, 60, replace=False).astype(np.int64)
    lens = rng.integers(1, 400, 60)
    truth = write_tokens(root / "tok" / "part-0.parquet", ids, lens, vocab=1000, row_group_size=7)
    order = np.lexsort((ids, lens))
    return root, ids[order], lens[order], truth


def _plan(root: Path, ids, lens, name: str, **kw) -> Path:
    cfg = PlanConfig(oversize="split", **kw)
    arrays, meta, extra = make_plan(ids, lens, cfg)
    out = root / name
    write_plan(out, meta, plan_tables(arrays), overwrite=True, rank_extra=extra)
    return out


@pytest.mark.parametrize("source", ["parquet", "arrow"])
@pytest.mark.parametrize(
    ("layout", "positions", "split_len"),
    [("packed", "restart", None), ("packed", "continue", 37), ("padded", "continue", 50)],
)
def test_pieces_are_slices_of_their_documents(corpus, source, layout, positions, split_len):
    root, ids, lens, truth = corpus
    plan = _plan(
        root,
        ids,
        lens,
        f"plan-{layout}-{positions}",
        max_tokens=128,
        layout=layout,
        split_len=split_len,
        split_positions=positions,
        dp=2,
        order="shuffle",
        epochs=2,
    )
    data = root / "tok"
    if source == "arrow":
        data = write_arrow_tokens(root / "tok", root / "copy.arrow", overwrite=True)
    seen = {int(i): np.zeros(len(t), np.int64) for i, t in truth.items()}
    for rank in (0, 1):
        loader = PlanLoader(plan, ParquetTokenDataset(data), rank=rank, world_size=2)
        for i, batch in enumerate(loader):
            row = loader.rows.row(i)
            offs = row.sample_offsets
            assert offs is not None
            sl = batch.seq_lens.numpy().astype(np.int64)
            want = [
                truth[int(s)][o : o + n] for s, o, n in zip(row.sample_ids, offs, sl, strict=True)
            ]
            for s, o, n in zip(row.sample_ids, offs, sl, strict=True):
                seen[int(s)][o : o + n] += 1
            if layout == "packed":
                tokens = batch.input_ids.numpy()[0]
                pos = batch.position_ids.numpy()[0]
                labels = batch.labels.numpy()[0]
                starts = np.concatenate(([0], np.cumsum(sl)[:-1]))
                assert np.array_equal(tokens[: sl.sum()], np.concatenate(want))
                shift = np.repeat(offs, sl) if positions == "continue" else 0
                seg = np.arange(sl.sum()) - np.repeat(starts, sl)
                assert np.array_equal(pos[: sl.sum()], seg + shift)
                assert (labels[starts] == IGNORE_INDEX).all()  # no label crosses a piece start
            else:
                tokens = batch.input_ids.numpy()
                pos = batch.position_ids.numpy()
                labels = batch.labels.numpy()
                for r, w in enumerate(want):
                    assert np.array_equal(tokens[r, : len(w)], w)
                    assert pos[r, 0] == (offs[r] if positions == "continue" else 0)
                assert (labels[: len(want), 0] == IGNORE_INDEX).all()
    assert all((v == 2).all() for v in seen.values())  # every token once per epoch


def test_map_style_dataset_and_bad_piece(corpus):
    root, ids, lens, truth = corpus
    sid = np.array([int(ids[-1]), int(ids[0])])
    offs = np.array([5, 0])
    n = np.array([7, 1])
    flat, got = fetch_flat(truth, sid, offs, n)
    assert np.array_equal(flat, np.concatenate([truth[sid[0]][5:12], truth[sid[1]][:1]]))
    assert got.tolist() == [7, 1]
    ds = ParquetTokenDataset(root / "tok")
    assert np.array_equal(ds.get_flat(sid, offs, n)[0], flat)
    with pytest.raises(InputError, match=f"sample id {sid[1]} has {len(truth[sid[1]])} tokens"):
        ds.get_flat(sid, offs, np.array([7, 10**6]))
