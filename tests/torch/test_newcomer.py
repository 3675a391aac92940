"""A newcomer's flow on Hugging Face-style tokenized text, end to end.

A small generated corpus with the columns a tokenized Hugging Face dataset has (``id``,
``input_ids``, ``source``), about a tenth of its documents longer than the 2,048-token budget and
holding most of its tokens, goes through ``lengths``, ``sort``, ``plan --oversize split`` and
``validate`` from the command line; then a tiny randomly initialised ``LlamaForCausalLM`` trains
on the plan through ``hf_inputs`` with two data-parallel ranks replayed in one process, and a run
resumed from the checkpoint saved after two steps matches the uninterrupted run exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from varpack.torch import ParquetTokenDataset, PlanLoader, check_vocab  # noqa: E402
from varpack.torch.hf import hf_inputs  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

BUDGET = 2048  # small, as the model: attention on the CPU costs the square of it
VOCAB = 512
DP = 2
SOURCES = ["code", "docs", "chat"]


def make_corpus(out: Path, seed: int = 0) -> dict[int, np.ndarray]:
    """Two Parquet files of documents (``id``, ``input_ids``, ``source``); returns id -> tokens."""
    rng = np.random.default_rng(seed)
    short = np.clip(rng.lognormal(np.log(BUDGET / 27), 1.0, 220), 8, BUDGET * 3 // 4).astype(
        np.int64
    )
    long = rng.integers(BUDGET + 1, 5 * BUDGET, 20)
    lens = rng.permutation(np.concatenate([short, long]))
    ids = rng.choice(10**6, len(lens), replace=False).astype(np.int64) * 7 + 3
    docs = {
        int(i): rng.integers(0, VOCAB, n).astype(np.int32) for i, n in zip(ids, lens, strict=True)
    }
    out.mkdir()
    half = len(ids) // 2
    for part, sl in enumerate([slice(0, half), slice(half, None)]):
        table = pa.table(
            {
                "id": pa.array(ids[sl]),
                "input_ids": pa.array([docs[int(i)] for i in ids[sl]], pa.list_(pa.int32())),
                "source": pa.array([SOURCES[int(i) % 3] for i in ids[sl]]),
            }
        )
        pq.write_table(table, out / f"part-{part}.parquet")
    return docs


def varpack(*args: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "varpack", *args], cwd=cwd, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, np.ndarray]]:
    root = tmp_path_factory.mktemp("newcomer")
    docs = make_corpus(root / "tokens")
    varpack(
        "lengths", "tokens", "meta", "--id-column", "id", "--arrow-copy", "tokens.arrow", cwd=root
    )
    varpack("sort", "meta", "sorted", cwd=root)
    varpack(
        "plan", "sorted", "plan", "--max-tokens", str(BUDGET), "--oversize", "split",
        "--dp", str(DP), "--order", "shuffle", "--seed", "0",
        "--carry", "source", "--carry-from", "tokens",
        cwd=root,
    )  # fmt: skip
    assert "OK" in varpack("validate", "plan", "--metadata", "meta", cwd=root)
    return root, docs


def test_split_keeps_every_token(flow: tuple[Path, dict[int, np.ndarray]]) -> None:
    root, docs = flow
    total = sum(len(d) for d in docs.values())
    long_docs = sum(len(d) > BUDGET for d in docs.values())
    tokens = json.loads((root / "plan" / "plan.json").read_text())["stats"]["tokens"]
    assert tokens["kept"] == tokens["total"] == total and tokens["kept_share"] == 1.0
    assert tokens["dropped"] == 0 and tokens["documents_split"] == long_docs
    assert tokens["split"] / total > 0.5  # the long documents hold most of the tokens
    seen: dict[int, dict[int, np.ndarray]] = {}
    for rank in range(DP):
        loader = PlanLoader(root / "plan", ParquetTokenDataset(root / "tokens.arrow"), rank=rank)
        for batch in loader:
            row = batch.input_ids.reshape(-1).numpy()
            bounds = np.r_[0, np.cumsum(batch.seq_lens.numpy())]
            for j, (sid, off) in enumerate(
                zip(batch.sample_ids.tolist(), batch.sample_offsets.tolist(), strict=True)
            ):
                assert off not in seen.setdefault(sid, {}), f"{sid}@{off} twice"
                seen[sid][off] = row[bounds[j] : bounds[j + 1]]
                assert batch.carry["source"][j] == SOURCES[sid % 3]
    assert seen.keys() == docs.keys()
    for sid, pieces in seen.items():
        whole = np.concatenate([pieces[o] for o in sorted(pieces)])
        np.testing.assert_array_equal(whole, docs[sid])
        assert all(len(p) <= BUDGET for p in pieces.values())


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=BUDGET,
    )
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")


def _train(root: Path, steps: range, state: Path | None, saves: dict[int, Path]) -> list[float]:
    """Train ``steps`` with both ranks' micro-batches in one process (DDP's mean, exactly);
    ``saves``: a checkpoint after step ``k - 1`` goes to ``saves[k]``."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = ParquetTokenDataset(root / "tokens.arrow")
    loaders = [PlanLoader(root / "plan", data, rank=r) for r in range(DP)]
    check_vocab(loaders[0], VOCAB)
    if state is not None:
        saved = torch.load(state, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        for loader, s in zip(loaders, saved["loaders"], strict=True):
            loader.load_state_dict(s)
    iters = [iter(loader) for loader in loaders]
    losses = []
    for step in steps:
        step_loss = 0.0
        for it in iters:
            while True:
                batch = next(it)
                kwargs = hf_inputs(batch, "sdpa", labels=True)
                out = model(**kwargs, num_items_in_batch=batch.label_tokens)
                # DDP averages over DP ranks; each rank would backpropagate out.loss * DP, so
                # the sum over ranks in one process is out.loss itself.
                out.loss.backward()
                step_loss += float(out.loss.detach())
                if batch.is_last_micro:
                    break
        opt.step()
        opt.zero_grad()
        losses.append(step_loss)
        if step + 1 in saves:
            torch.save(
                {
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "loaders": [loader.state_dict() for loader in loaders],
                },
                saves[step + 1],
            )
    return losses


def test_hf_training_resumes_exactly(flow: tuple[Path, dict[int, np.ndarray]]) -> None:
    root, _ = flow
    # the uninterrupted run also saves the checkpoint after two steps that the resumed run
    # starts from (the same as a run stopped there: training is deterministic on the CPU)
    whole = _train(root, range(4), None, {2: root / "half.pt", 4: root / "whole.pt"})
    rest = _train(root, range(2, 4), root / "half.pt", {4: root / "resumed.pt"})
    assert rest == whole[2:]
    a = torch.load(root / "whole.pt", weights_only=False)["model"]
    b = torch.load(root / "resumed.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(np.isfinite(whole)) and whole[-1] < whole[0] + 1.0
