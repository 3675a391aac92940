"""PlanLoader(vision=...): each micro-batch of a plan as a VisionBatch, the samples being what a
Qwen2-VL processor returns; the row is pack_vlm's, padded to the plan's pad_to, and gives every
sample the logits it has alone (tiny random Qwen2-VL, CPU, fp32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
from plan_helpers import make_plan  # noqa: E402
from vlm_helpers import IMAGE, model_of, sample  # noqa: E402

from varpack.errors import ConfigError, InputError  # noqa: E402
from varpack.torch import PlanLoader  # noqa: E402
from varpack.torch.hf import hf_inputs  # noqa: E402
from varpack.torch.vlm import IGNORE_INDEX, VisionBatch, pack_vlm  # noqa: E402

pytestmark = pytest.mark.torch

GRIDS = [[(1, 4, 4)], [], [(1, 8, 4), (1, 2, 2)], [(1, 4, 8)], [], [(1, 2, 4)], [(1, 4, 4)],
         [(1, 2, 2), (1, 2, 2), (1, 4, 4)], [], [(1, 8, 8)], [(1, 2, 6)], []]  # fmt: skip


def _data(seed: int = 0, own_labels: bool = False) -> tuple[dict[int, dict], dict[int, int]]:
    """Twelve samples by id (text only, one to three images), and their token counts."""
    rng = np.random.default_rng(seed)
    samples = {100 + i: sample(rng, 3 + i, grids) for i, grids in enumerate(GRIDS)}
    for s in samples.values():
        if own_labels:  # the image placeholders supervise nothing
            s["labels"] = s["input_ids"].masked_fill(s["input_ids"] == IMAGE, IGNORE_INDEX)
    return samples, {i: int(s["input_ids"].shape[1]) for i, s in samples.items()}


def _plan(tmp: Path, lens: dict[int, int], **kw: Any) -> Path:
    return make_plan(tmp / "plan", lens, dp=2, grad_accum=2, budget=60, pad_multiple=16, **kw)


def _batches(plan: Path, data: Any, config: Any, workers: int = 0) -> list[VisionBatch]:
    return [b for rank in range(2)
            for b in PlanLoader(plan, data, rank=rank, world_size=2, vision=config,
                                num_workers=workers)]  # fmt: skip


def test_each_batch_is_the_packed_row_of_its_samples_padded_to_the_plan(tmp_path: Path) -> None:
    samples, lens = _data()
    config = model_of("qwen2_vl", "sdpa").config
    batches = _batches(_plan(tmp_path, lens), samples, config)
    seen: list[int] = []
    tails = 0
    for b in batches:
        assert isinstance(b, VisionBatch)
        ids = b.sample_ids.tolist()
        seen += ids
        want = pack_vlm([samples[i] for i in ids], config)
        got = hf_inputs(b.to("cpu"), "sdpa", labels=True)
        n = sum(lens[i] for i in ids)
        width = got["input_ids"].shape[1]
        assert width % 16 == 0 and n <= width < n + 16
        tails += width > n
        for key in ("input_ids", "mm_token_type_ids", "labels", "position_ids"):
            assert torch.equal(got[key][..., :n], want[key]), key
        assert got["position_ids"].shape == (4, 1, width)
        assert (got["labels"][0, n:] == IGNORE_INDEX).all()
        assert (got["mm_token_type_ids"][0, n:] == 0).all()
        for key in ("pixel_values", "image_grid_thw"):
            assert (key in got) == (key in want) and (
                key not in want or torch.equal(got[key], want[key])
            )
        assert b.micro_label_tokens == int((want["labels"] != IGNORE_INDEX).sum())
        assert b.label_tokens == b.step_tokens - b.step_samples  # labels are the tokens
    assert sorted(seen) == sorted(samples) and tails > 0


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl"])
def test_a_padded_row_gives_every_sample_its_logits_alone(tmp_path: Path, kind: str) -> None:
    samples, lens = _data(1)
    model = model_of(kind, "sdpa")
    batches = _batches(_plan(tmp_path, lens), samples, model.config)
    b = max(batches, key=lambda x: (len(x.sample_ids), x.input_ids.shape[1] - x.num_tokens))
    assert b.input_ids.shape[1] > b.num_tokens  # a padding tail
    with torch.no_grad():
        packed = model(**hf_inputs(b, "sdpa")).logits[0]
        at = 0
        for i in b.sample_ids.tolist():
            alone = model(**samples[i]).logits[0]
            torch.testing.assert_close(packed[at : at + len(alone)], alone, rtol=0, atol=1e-5)
            at += len(alone)


def test_workers_make_the_same_batches(tmp_path: Path) -> None:
    samples, lens = _data(2)
    config = model_of("qwen2_vl", "sdpa").config
    plan = _plan(tmp_path, lens)
    here, there = _batches(plan, samples, config), _batches(plan, samples, config, workers=2)
    assert len(here) == len(there)
    for a, b in zip(here, there, strict=True):
        for key in ("input_ids", "labels", "rope_positions", "mm_token_type_ids", "pixel_values"):
            x, y = getattr(a, key), getattr(b, key)
            assert (x is None and y is None) or torch.equal(x, y), key


def test_own_labels_are_counted_per_micro_batch_and_the_plans_count_refused(
    tmp_path: Path,
) -> None:
    samples, lens = _data(3, own_labels=True)
    config = model_of("qwen2_vl", "sdpa").config
    batches = _batches(_plan(tmp_path, lens), samples, config)
    want = sum(int((s["labels"][0, 1:] != IGNORE_INDEX).sum()) for s in samples.values())
    assert sum(b.micro_label_tokens for b in batches) == want
    assert want < sum(lens.values()) - len(lens)  # the placeholders left out
    with pytest.raises(InputError, match="sum micro_label_tokens over the step") as err:
        batches[0].label_tokens  # noqa: B018
    assert "\n" not in str(err.value)


def test_data_that_is_not_the_plans_is_one_line(tmp_path: Path) -> None:
    samples, lens = _data(4)
    config = model_of("qwen2_vl", "sdpa").config
    plan = _plan(tmp_path, lens)
    first = next(iter(PlanLoader(plan, samples, rank=0, world_size=2, vision=config)))
    sid = int(first.sample_ids[0])
    short = dict(samples)
    short[sid] = {k: v[:, :-1] if k in ("input_ids", "mm_token_type_ids") else v
                  for k, v in samples[sid].items()}  # fmt: skip
    with pytest.raises(InputError) as err:
        next(iter(PlanLoader(plan, short, rank=0, world_size=2, vision=config)))
    assert f"sample id {sid} has {lens[sid] - 1} tokens in the dataset, the plan says" in str(
        err.value
    )
    untyped = dict(samples)
    untyped[sid] = {"input_ids": samples[sid]["input_ids"]}
    with pytest.raises(InputError) as err:
        next(iter(PlanLoader(plan, untyped, rank=0, world_size=2, vision=config, num_workers=1)))
    assert str(err.value).startswith("step 0 micro 0: sample id ")
    assert "give input_ids and mm_token_type_ids" in str(err.value) and "\n" not in str(err.value)


def test_plans_and_models_it_cannot_read_are_refused(tmp_path: Path) -> None:
    samples, lens = _data(5)
    config = model_of("qwen2_vl", "sdpa").config
    padded = make_plan(tmp_path / "padded", lens, dp=2, layout="padded", budget=120)
    with pytest.raises(ConfigError, match="reads packed plans without --cp; this one is padded"):
        PlanLoader(padded, samples, rank=0, world_size=2, vision=config)
    with pytest.raises(InputError, match="has no vision_config"):
        PlanLoader(_plan(tmp_path, lens), samples, rank=0, world_size=2,
                   vision=torch.nn.Linear(2, 2))  # fmt: skip
