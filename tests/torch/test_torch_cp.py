"""Context-parallel replay: shards cover every token once; dp 2 x cp 2 equals dp 2 (gloo)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402
from plan_helpers import ranks, write_tokens  # noqa: E402
from testkit import cli, write_metadata  # noqa: E402

from varpack.torch.batch import PackedBatch  # noqa: E402
from varpack.torch.cp import shard  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _packed(lens: list[int]) -> PackedBatch:
    from varpack.torch.collate import pack_packed

    tokens = np.arange(sum(lens), dtype=np.int64) + 1
    f = pack_packed(tokens, np.array(lens), sum(lens) + 3)
    t = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in f.items()}
    for k in ("input_ids", "position_ids", "labels"):
        t[k] = t[k].view(1, -1)
    return PackedBatch(step=0, micro=0, lr_factor=1.0, step_tokens=sum(lens), step_samples=len(lens),
                       is_last_micro=True, warmup=False, epoch=0, sample_ids=np.arange(len(lens)),
                       seq_lens=np.array(lens, np.int32), **t)  # fmt: skip


@pytest.mark.parametrize("n", [2, 3, 4])
def test_shards_cover_every_token_once_with_balanced_chunks(n):
    lens = [5, 17, 3, 40, 8, 1]
    placement = np.array([0, -1, n - 1, -1, 1, -1])
    batch = _packed(lens)
    shards = [shard(batch, placement, r, n) for r in range(n)]
    ids = sorted(x for s in shards for x in s.input_ids[0].tolist())
    assert ids == list(range(1, sum(lens) + 1))  # token values are their index + 1
    for s in shards:  # positions are the positions in the sample; targets are the next token
        pos = s.position_ids[0]
        tok = s.input_ids[0]
        starts = np.concatenate([[0], np.cumsum(lens)])
        sample = np.searchsorted(starts, tok.numpy() - 1, side="right") - 1
        assert np.array_equal(pos.numpy(), tok.numpy() - 1 - starts[sample])
        last = pos.numpy() == np.array(lens)[sample] - 1
        assert (s.targets[0].numpy()[last] == -100).all()
        assert np.array_equal(s.targets[0].numpy()[~last], tok.numpy()[~last] + 1)
    # distributed sample of 40 tokens: 2n chunks, each rank two of them, as even as 40 / n allows
    share = [int((s.placement < 0).sum() and s.input_ids.shape[1] - s.meta.n_local) for s in shards]
    dist_total = 17 + 40 + 1
    assert sum(share) == dist_total and max(share) - min(share) <= 2 * 3


def equivalence(nproc: int, *args: object) -> None:
    ranks(nproc, HERE / "cp_equivalence.py", *args)


@pytest.mark.slow
def test_dp2_cp2_equals_dp2(tmp_path) -> None:
    rng = np.random.default_rng(3)
    lens = {
        i: int(x)
        for i, x in enumerate(np.concatenate([rng.integers(2, 12, 40), rng.integers(30, 60, 8)]))
    }
    write_tokens(tmp_path / "tok.parquet", list(lens), list(lens.values()), row_group_size=16)
    write_metadata(tmp_path / "meta" / "m.parquet", list(lens), list(lens.values()))
    plan = tmp_path / "plan"
    cli("plan", tmp_path / "meta", plan, "--dp", 2, "--grad-accum", 2, "--cp", 2,
        "--bucket-size", 40, "--order", "shuffle", "--seed", 1, "-q")  # fmt: skip
    meta = json.loads((plan / "plan.json").read_text())
    assert meta["cp"]["distributed_samples"] > 0 and meta["cp"]["local_samples"] > 0
    equivalence(4, plan, tmp_path / "tok.parquet", tmp_path / "out", "cp")
    equivalence(2, plan, tmp_path / "tok.parquet", tmp_path / "out", "dp")
    cp = torch.load(tmp_path / "out" / "cp.pt")
    dp = torch.load(tmp_path / "out" / "dp.pt")
    assert len(cp["losses"]) == len(dp["losses"]) == meta["num_steps"]
    assert np.allclose(cp["losses"], dp["losses"], rtol=1e-5, atol=1e-6)
    for a, b in zip(cp["grads"], dp["grads"], strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), float((a - b).abs().max())
    # every token of every micro-batch exactly once across its CP group (ranks 2d and 2d + 1)
    for d in range(2):
        a, b = (
            json.loads((tmp_path / "out" / f"seen-cp-{2 * d + r}.json").read_text())
            for r in range(2)
        )
        for x, y in zip(a, b, strict=True):
            assert (x["step"], x["micro"]) == (y["step"], y["micro"])
            assert len(x["ids"]) + len(y["ids"]) == x["total"]


def _train(nproc: int, plan: Path, tmp: Path, *extra: object) -> list[str]:
    proc = ranks(
        nproc, ROOT / "jobs" / "train.py", "--plan", plan, "--data", tmp / "tok.parquet",
        "--out", tmp / f"run{nproc}", "--warmup-steps", 1, *extra,
    )  # fmt: skip
    return [line.split("lr")[0] for line in proc.stdout.splitlines() if " loss " in line]


@pytest.mark.slow
def test_train_py_cp_matches_dp(tmp_path) -> None:
    rng = np.random.default_rng(4)
    lens = {
        i: int(x)
        for i, x in enumerate(np.concatenate([rng.integers(2, 12, 30), rng.integers(30, 60, 6)]))
    }
    write_tokens(tmp_path / "tok.parquet", list(lens), list(lens.values()), row_group_size=16)
    write_metadata(tmp_path / "meta" / "m.parquet", list(lens), list(lens.values()))
    plan = tmp_path / "plan"
    cli("plan", tmp_path / "meta", plan, "--dp", 2, "--cp", 2, "--bucket-size", 40, "-q")
    with_cp = _train(4, plan, tmp_path, "--cp", 2)
    without = _train(2, plan, tmp_path)
    assert with_cp and with_cp == without  # the same losses, printed to 4 decimals
