"""batch.carry: carried metadata columns reach the batch, per sample, in every layout; per-group loss."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch.nn")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from plan_helpers import write_tokens  # noqa: E402
from testkit import cli, write_metadata  # noqa: E402

from varpack.errors import ConfigError  # noqa: E402
from varpack.torch import (  # noqa: E402
    ParquetTokenDataset,
    PlanLoader,
    group_losses,
    sample_losses,
    token_losses,
)

LAYOUTS = {
    "packed": ["--max-tokens", 256],
    "padded": ["--max-tokens", 256, "--layout", "padded"],
    "blocks": ["--batching", "blocks", "--block-len", 128, "--blocks-per-batch", 2],
}


@pytest.fixture
def data(tmp_path, rng):
    n = 120
    ids = rng.permutation(1000)[:n].astype(np.int64)
    lens = rng.integers(1, 100, n)
    cols = {
        "source": np.array(["web", "code", "books"], dtype=object)[rng.integers(0, 3, n)],
        "score": rng.random(n),
        "lang": rng.integers(0, 4, n),
        "keep": rng.random(n) < 0.5,
    }
    write_metadata(tmp_path / "meta" / "a.parquet", ids, lens, **cols)
    write_tokens(tmp_path / "tok.parquet", ids, lens, vocab=50, row_group_size=16)
    lookup = {k: dict(zip(ids.tolist(), v.tolist(), strict=True)) for k, v in cols.items()}
    return tmp_path, lookup


def _plan(tmp_path, layout: str) -> PlanLoader:
    out = tmp_path / f"plan-{layout}"
    carry = ["--carry", "source", "--carry", "score", "--carry", "lang", "--carry", "keep"]
    cli("plan", tmp_path / "meta", out, "--dp", 2, *LAYOUTS[layout], *carry)
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("workers", [0, 2])
def test_batches_carry_each_samples_values(data, layout, workers):
    tmp_path, lookup = data
    plan = _plan(tmp_path, layout)
    seen = 0
    for rank in range(2):
        loader = PlanLoader(plan, ParquetTokenDataset(tmp_path / "tok.parquet"), rank=rank,
                            num_workers=workers)  # fmt: skip
        for batch in loader:
            ids = batch.sample_ids.tolist()
            assert batch.carry["source"] == [lookup["source"][i] for i in ids]
            assert batch.carry["score"].dtype == torch.float64
            assert batch.carry["score"].tolist() == [lookup["score"][i] for i in ids]
            assert batch.carry["lang"].dtype == torch.int64
            assert batch.carry["lang"].tolist() == [lookup["lang"][i] for i in ids]
            assert batch.carry["keep"].dtype == torch.bool
            assert batch.carry["keep"].tolist() == [lookup["keep"][i] for i in ids]
            moved = batch.to("cpu")
            assert moved.carry["source"] == batch.carry["source"]
            assert torch.equal(moved.carry["lang"], batch.carry["lang"])
            seen += len(ids)
    assert seen == len(lookup["source"])


def test_plan_without_carry_gives_an_empty_dict(data):
    tmp_path, _ = data
    cli("plan", tmp_path / "meta", tmp_path / "p", "--max-tokens", 256)
    batch = next(iter(PlanLoader(tmp_path / "p", ParquetTokenDataset(tmp_path / "tok.parquet"))))
    assert batch.carry == {}
    with pytest.raises(ConfigError, match="plan with --carry source"):
        group_losses(batch, torch.zeros(1, batch.input_ids.shape[1] - 1), "source")


def _alone(batch, logits: torch.Tensor) -> torch.Tensor:
    """Each sample's loss sum computed on its own tokens (the reference)."""
    out = []
    for i, n in enumerate(batch.seq_lens.tolist()):
        if hasattr(batch, "block_index"):
            row, start = int(batch.block_index[i]), int(batch.starts[i])
        elif hasattr(batch, "cu_seqlens"):
            row, start = 0, int(batch.cu_seqlens[i])
        else:
            row, start = i, 0
        lg, ids = logits[row, start : start + n], batch.input_ids[row, start : start + n]
        out.append(F.cross_entropy(lg[:-1], ids[1:], reduction="sum"))
    return torch.stack(out)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sample_and_group_losses_match_per_sample_reference(data, layout):
    tmp_path, lookup = data
    loader = PlanLoader(_plan(tmp_path, layout), ParquetTokenDataset(tmp_path / "tok.parquet"),
                        rank=0)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    for batch in list(loader)[:6]:
        logits = torch.randn(*batch.input_ids.shape, 50, generator=gen)
        losses = token_losses(logits, batch.labels)
        per_sample = sample_losses(batch, losses)
        assert torch.allclose(per_sample, _alone(batch, logits), atol=1e-4)
        keys, sums, tokens = group_losses(batch, losses, "source")
        sources = batch.carry["source"]
        assert keys == sorted(set(sources))
        for g, key in enumerate(keys):
            mine = [k for k, s in enumerate(sources) if s == key]
            assert torch.allclose(sums[g], per_sample[mine].sum(), atol=1e-4)
            assert int(tokens[g]) == int((batch.seq_lens[mine] - 1).sum())
        keys, _, _ = group_losses(batch, losses, "lang")  # numeric keys
        assert keys == sorted(set(batch.carry["lang"].tolist()))
