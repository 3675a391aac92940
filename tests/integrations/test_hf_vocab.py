"""``VarpackTrainer`` checks the plan's token ids against the model's vocabulary before anything is
built: one line naming the largest id and what to raise, not an ``IndexError`` in the embedding
(a device-side assert on CUDA) once training runs. (Under torchrun every rank says it:
test_hf_world.py.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("torch.nn")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from hf_helpers import gpt_loss, make_plans, readme_llama  # noqa: E402
from torch import nn  # noqa: E402

from varpack.errors import InputError  # noqa: E402
from varpack.integrations.hf import VarpackTrainer, model_vocab  # noqa: E402
from varpack.torch import ParquetTokenDataset, PlanLoader  # noqa: E402
from varpack.torch.model import PRESETS, GPTConfig, TinyGPT  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out: dict[str, Any] = make_plans(tmp_path_factory.mktemp("hf_vocab"))
    ids = pq.read_table(out["tokens"]).column("input_ids").combine_chunks().flatten()
    out["top"] = int(np.max(ids.to_numpy()))
    return out


def trainer(data: dict[str, Any], model: Any, out: str = "run", **kw: Any) -> VarpackTrainer:
    args = transformers.TrainingArguments(
        str(data["tmp"] / out), report_to="none", disable_tqdm=True, use_cpu=True
    )
    loader = PlanLoader(data["dp1"], ParquetTokenDataset(data["tokens"]))  # every sample
    return VarpackTrainer(model, args, plan_loader=loader, **kw)


def refused(data: dict[str, Any], model: Any, **kw: Any) -> str:
    with pytest.raises(InputError) as err:
        trainer(data, model, "refused", **kw)
    line = str(err.value)
    assert "\n" not in line and f"token id {data['top']:,}" in line
    assert f"to at least {data['top'] + 1:,}" in line
    assert not (data["tmp"] / "refused").exists()  # before anything is built or written
    return line


def test_a_vocabulary_smaller_than_the_data_is_one_line(data: dict[str, Any]) -> None:
    top = data["top"]
    line = refused(data, readme_llama(vocab_size=64))
    assert "rank 0's samples" in line and "vocabulary has 64 entries" in line
    assert "config.vocab_size" in line and "resize_token_embeddings" in line
    refused(data, readme_llama(vocab_size=top))  # one short
    trainer(data, readme_llama(vocab_size=top + 1))  # every id fits


def test_the_output_head_counts_too(data: dict[str, Any]) -> None:
    """Labels index the logits: a head narrower than the embedding is the vocabulary."""
    model = readme_llama()
    model.lm_head = nn.Linear(64, 128, bias=False)
    assert model_vocab(model) == (128, model_vocab(readme_llama())[1])  # type: ignore[index]
    assert "has 128 entries" in refused(data, model)


def test_modules_that_are_not_transformers_models(data: dict[str, Any]) -> None:
    small = TinyGPT(GPTConfig(**{**PRESETS["tiny"].__dict__, "vocab_size": 100}))
    assert "model.cfg.vocab_size" in refused(data, small, loss_fn=gpt_loss)
    plain = nn.Sequential(nn.Embedding(100, 8))  # says nothing about its vocabulary
    assert model_vocab(plain) is None
    trainer(data, plain, loss_fn=gpt_loss)  # not checked
    assert "vocab_size=" in refused(data, plain, loss_fn=gpt_loss, vocab_size=100)
