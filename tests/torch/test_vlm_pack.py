"""pack_vlm: Qwen2-VL and Qwen2.5-VL samples packed into one row give each sample's logits as
when it runs alone, and a step's loss and gradients as the samples run one by one (tiny random
models of transformers 5, CPU, fp32)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from vlm_helpers import PATCH_IN, model_of, sample, some_samples  # noqa: E402

from varpack.errors import InputError  # noqa: E402
from varpack.torch.vlm import IGNORE_INDEX, mrope_positions, pack_vlm  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_are_each_samples_alone(kind: str, attn: str) -> None:
    model = model_of(kind, attn)
    samples = some_samples()
    with torch.no_grad():
        alone = [model(**s).logits[0] for s in samples]
        packed = model(**pack_vlm(samples, model, attn, labels=False)).logits[0]
    at = 0
    for a in alone:
        torch.testing.assert_close(packed[at : at + len(a)], a, rtol=0, atol=1e-5)
        at += len(a)
    assert at == packed.shape[0]


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl"])
def test_a_steps_loss_and_gradients_are_the_unpacked_batchs(kind: str) -> None:
    model = model_of(kind, "sdpa").train()
    samples = some_samples(1)
    items = sum(
        int(s["input_ids"].shape[1]) - 1 for s in samples
    )  # each predicts all but its first
    packed = model(**pack_vlm(samples, model), num_items_in_batch=items)
    packed.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    loss = sum(model(**s, labels=s["input_ids"], num_items_in_batch=items).loss for s in samples)
    loss.backward()  # type: ignore[union-attr]
    torch.testing.assert_close(packed.loss, loss, rtol=1e-5, atol=0)
    assert any("visual" in n for n in grads)  # the tower learns from the packed step too
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl"])
def test_positions_are_the_models_get_rope_index(kind: str) -> None:
    model = model_of(kind, "sdpa")
    for seed in range(3):
        for s in some_samples(seed):
            if "image_grid_thw" not in s and "video_grid_thw" not in s:
                continue
            extra = {"second_per_grid_ts": s["second_per_grid_ts"]} if kind == "qwen2_5_vl" and (
                "second_per_grid_ts" in s) else {}  # fmt: skip
            want, _ = model.model.get_rope_index(
                s["input_ids"], mm_token_type_ids=s["mm_token_type_ids"],
                image_grid_thw=s.get("image_grid_thw"), video_grid_thw=s.get("video_grid_thw"),
                **extra)  # fmt: skip
            got = pack_vlm([s], model.config)["position_ids"]
            assert got[1:].tolist() == want.tolist()
            assert got[0, 0].tolist() == list(range(s["input_ids"].shape[1]))


def test_positions_restart_with_every_sample_and_labels_skip_first_tokens() -> None:
    model = model_of("qwen2_vl", "sdpa")
    samples = some_samples()
    got = pack_vlm(samples, model)
    pos, labels = got["position_ids"], got["labels"][0]
    at = 0
    for s in samples:
        n = s["input_ids"].shape[1]
        assert pos[0, 0, at : at + n].tolist() == list(range(n))  # the text row
        assert labels[at] == IGNORE_INDEX and labels[at + 1 : at + n].tolist() == (
            s["input_ids"][0, 1:].tolist()
        )
        at += n
    assert got["pixel_values"].shape[0] == int(got["image_grid_thw"].prod(-1).sum())
    assert got["image_grid_thw"].shape == (5, 3) and got["video_grid_thw"].shape == (2, 3)
    assert got["attention_mask"].shape == (1, 1, at, at)
    flash = pack_vlm(samples, model, "flash_attention_2")
    assert "attention_mask" not in flash
    assert flash["cu_seq_lens_q"].tolist() == np.cumsum([0] + [s["input_ids"].shape[1]
                                                              for s in samples]).tolist()  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.pop("image_grid_thw"), "give pixel_values and image_grid_thw together"),
        (lambda s: s.update(pixel_values=s["pixel_values"][:-1]),
         "pixel_values has shape (15, 96), its image_grid_thw 16 patches"),
        (lambda s: s.update(image_grid_thw=torch.tensor([[1, 4, 8]]),
                            pixel_values=torch.zeros(32, PATCH_IN)),
         "image_grid_thw[0] [1, 4, 8] makes 8 placeholder tokens, its run holds 4"),
        (lambda s: s.update(image_grid_thw=torch.tensor([[1, 3, 4]]),
                            pixel_values=torch.zeros(12, PATCH_IN)),
         "image_grid_thw[0] is [1, 3, 4]; each of t, h, w must be >= 1, h and w multiples"),
        (lambda s: s.update(image_grid_thw=torch.tensor([[1, 4, 4, 1]])), "shape (k, 3)"),
        (lambda s: s.update(image_grid_thw=torch.tensor([[1.0, 4.0, 4.0]])),
         "image_grid_thw has dtype torch.float32; give integers"),
        (lambda s: s.update(input_ids=s["input_ids"].float()), "input_ids has dtype torch.float32"),
        (lambda s: s.update(input_ids="abc"), "input_ids must be a tensor, an array or a list"),
        (lambda s: s["mm_token_type_ids"].__setitem__((0, 1), 3),
         "mm_token_type_ids[1] is 3; token types are 0 (text), 1 (image) and 2 (video)"),
        (lambda s: s["mm_token_type_ids"].__setitem__((0, 7), 0),
         "2 runs of type-1 placeholder tokens, 1 grids in image_grid_thw"),
        (lambda s: s.update(second_per_grid_ts=torch.tensor([1.0])),
         "second_per_grid_ts without videos"),
        (lambda s: s.update(mm_token_type_ids=s["mm_token_type_ids"][:, :-1]),
         "mm_token_type_ids has"),
        (lambda s: s.pop("mm_token_type_ids"), "give input_ids and mm_token_type_ids"),
        (lambda s: s.update(labels=torch.zeros(3, dtype=torch.long)), "labels has 3 tokens"),
    ],
)  # fmt: skip
def test_mismatched_samples_are_one_line(edit: Any, message: str) -> None:
    model = model_of("qwen2_vl", "sdpa")
    samples = some_samples()
    edit(samples[0])
    with pytest.raises(InputError) as err:
        pack_vlm(samples, model)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("sample 0: ")
    with pytest.raises(InputError, match="has no vision_config"):
        pack_vlm(some_samples(), torch.nn.Linear(2, 2))


def test_video_seconds_are_checked_and_spaced_in_float32_as_the_model_does() -> None:
    """0.7 s per grid step at 4 tokens a second: 2.8 in float32 is 2.7999999..., so the frame
    index x 2.8 truncates as the model's does (0, 2, 5, 8, ...), not as in float64."""
    model = model_of("qwen2_5_vl", "sdpa")
    rng = np.random.default_rng(5)
    s = sample(rng, 3, [], videos=((6, 2, 2), (3, 2, 4)))
    for seconds in ([0.7, 1 / 0.7], [25 / 100, 2 / 0.7]):
        s["second_per_grid_ts"] = torch.tensor(seconds)  # float32, as the processor returns it
        want, _ = model.model.get_rope_index(
            s["input_ids"], mm_token_type_ids=s["mm_token_type_ids"],
            video_grid_thw=s["video_grid_thw"], second_per_grid_ts=s["second_per_grid_ts"])  # fmt: skip
        assert pack_vlm([s], model.config)["position_ids"][1:].tolist() == want.tolist()
    for bad, message in (([1.0], "gives 1 values for 2 videos"),
                         ([float("nan"), 1.0], "give finite seconds >= 0")):  # fmt: skip
        s["second_per_grid_ts"] = torch.tensor(bad)
        with pytest.raises(InputError, match=message):
            pack_vlm([s], model.config)


def test_stored_token_types_and_shapes_are_taken() -> None:
    """uint16 token ids (as a token copy stores them), lists, (3,) grids: packed as int64."""
    model = model_of("qwen2_vl", "sdpa")
    s = some_samples()[0]
    other = {"input_ids": s["input_ids"][0].numpy().astype(np.uint16),
             "mm_token_type_ids": s["mm_token_type_ids"][0].tolist(),
             "pixel_values": s["pixel_values"], "image_grid_thw": [1, 4, 4]}  # fmt: skip
    a, b = pack_vlm([s], model.config), pack_vlm([other], model.config)
    for key in ("input_ids", "mm_token_type_ids", "position_ids", "image_grid_thw", "labels"):
        assert b[key].dtype == torch.int64 and b[key].tolist() == a[key].tolist(), key
    assert mrope_positions(np.zeros(0, np.int64), None, None, 2).shape == (3, 0)
    with pytest.raises(InputError, match="mask's dtype is a float dtype"):
        pack_vlm([s], model.config, "eager", dtype=torch.int64)
    wide = {**s, "pixel_values": torch.zeros(16, PATCH_IN + 1)}
    with pytest.raises(InputError, match="rows differ in width across samples"):
        pack_vlm([s, wide], model.config)
