"""plan_batch(model=...): a rollout batch balanced in a real model's FLOPs."""

from __future__ import annotations

import numpy as np
import pytest

from varpack.errors import ConfigError
from varpack.online import plan_batch
from varpack.plan.models import PRESET_CONFIGS, preset_spec
from varpack.plan.models.flops import sample_train_flops


def _rollout(n: int) -> np.ndarray:
    rng = np.random.default_rng(2)
    return np.minimum(rng.lognormal(np.log(3000), 0.9, n), 8192).astype(np.int64) + 300


def test_the_model_is_given_as_a_config_dict_a_preset_or_a_spec() -> None:
    lens = _rollout(2048)
    kw = dict(dp=4, max_tokens=16384, mini_batches=2, cost="flops")
    plans = [
        plan_batch(lens, model=PRESET_CONFIGS["mistral-7b-v0.1"][1], **kw),  # type: ignore[arg-type]
        plan_batch(lens, model="mistral-7b-v0.1", **kw),  # type: ignore[arg-type]
        plan_batch(lens, model=preset_spec("mistral-7b-v0.1"), **kw),  # type: ignore[arg-type]
    ]
    assert len({p.digest() for p in plans}) == 1
    fig = plans[0].figures
    assert fig["time_vs_ideal"] <= 1.02 and fig["bound"] <= fig["time_vs_ideal"] + 1e-12
    # the ideal is the model's own per-sample FLOPs
    ideal = sample_train_flops(lens, preset_spec("mistral-7b-v0.1")).sum() / 4
    assert fig["ideal_time"] == pytest.approx(ideal, rel=1e-12)


def test_a_bad_model_is_one_line_in_the_apis_words() -> None:
    with pytest.raises(ConfigError, match="model 'gpt-9' is not a preset"):
        plan_batch(_rollout(64), dp=2, max_tokens=16384, cost="flops", model="gpt-9")
    with pytest.raises(ConfigError, match="model: no num_hidden_layers"):
        plan_batch(_rollout(64), dp=2, max_tokens=16384, cost="flops",
                   model={"model_type": "llama", "hidden_size": 8})  # fmt: skip
    with pytest.raises(
        ConfigError,
        match=r"needs the model: pass model .*Skrull's hidden, kv_hidden .* and layers",
    ):
        plan_batch(_rollout(64), dp=2, max_tokens=16384, cost="flops")
