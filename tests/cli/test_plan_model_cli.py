"""`plan`, `replan`, `inspect` and `validate` with a model: --model CONFIG, presets, Skrull's
dimensions; the model recorded in plan.json and a hand edit of it refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from testkit import cli, write_shards

from varpack.plan.models import PRESET_CONFIGS, preset_spec
from varpack.planfile.format import load_plan

BASE = ["--max-tokens", 8192, "--dp", 2, "--grad-accum", 2, "--order", "shuffle", "-q"]


@pytest.fixture
def meta(tmp_path: Path) -> Path:
    rng = np.random.default_rng(4)
    lens = np.clip(rng.lognormal(6.5, 1.1, 3000), 8, 8192).astype(np.int64)
    return write_shards(tmp_path / "meta", np.arange(3000), lens, [1500, 1500])


def _config(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    fields = {**PRESET_CONFIGS[name][1], "torch_dtype": "bfloat16", "rope_theta": 1e6}
    (d / "config.json").write_text(json.dumps(fields))
    return d


def test_a_config_json_prices_the_plan_as_its_preset(tmp_path: Path, meta: Path) -> None:
    d = _config(tmp_path, "gemma-2-2b")
    cli("plan", meta, tmp_path / "a", *BASE, "--cost", "flops", "--model", d)
    cli("plan", meta, tmp_path / "b", *BASE, "--cost", "flops", "--model-preset", "gemma-2-2b")
    a, b = load_plan(tmp_path / "a").meta, load_plan(tmp_path / "b").meta
    assert a["config"]["model"] == b["config"]["model"] == preset_spec("gemma-2-2b").to_dict()
    assert a["config"]["model_digest"] == preset_spec("gemma-2-2b").digest()
    assert a["config"]["model_preset"] is None and b["config"]["model_preset"] == "gemma-2-2b"
    assert a["stats"] == b["stats"]
    for rank in ("rank-00000.parquet", "rank-00001.parquet"):
        assert (tmp_path / "a" / rank).read_bytes() == (tmp_path / "b" / rank).read_bytes()
    replay = cli("validate", tmp_path / "a", "--metadata", meta, "--replay")
    assert replay.stdout.startswith("OK ") and "same rows" in replay.stdout
    shown = cli("inspect", tmp_path / "b").stdout
    (line,) = [x for x in shown.splitlines() if x.startswith("model ")]
    assert "gemma-2-2b, gemma2: 26 layers" in line and "windows 4096 on 13 of 26" in line
    assert preset_spec("gemma-2-2b").digest() in line


def test_inspect_names_skrulls_approximation(tmp_path: Path, meta: Path) -> None:
    cli("plan", meta, tmp_path / "s", *BASE, "--cost", "flops", "--hidden", 896, "--kv-hidden",
        128, "--layers", 24)  # fmt: skip
    shown = cli("inspect", tmp_path / "s").stdout
    assert "Skrull's approximation: hidden 896, kv hidden 128, 24 layers" in shown
    assert "model" not in load_plan(tmp_path / "s").meta["config"]
    cli("plan", meta, tmp_path / "t", *BASE)
    assert "Skrull" not in cli("inspect", tmp_path / "t").stdout


def test_a_model_edited_in_plan_json_is_refused(tmp_path: Path, meta: Path) -> None:
    out = tmp_path / "p"
    cli("plan", meta, out, *BASE, "--cost", "flops", "--model-preset", "qwen2.5-0.5b")
    doc = json.loads((out / "plan.json").read_text())
    doc["config"]["model"]["vocab"] = 32000
    doc["config"]["model_preset"] = None
    (out / "plan.json").write_text(json.dumps(doc))
    res = cli("validate", out, expect=None)
    assert res.exit_code != 0 and "plan.json" in res.stdout + res.stderr


def test_replan_keeps_the_model_or_takes_another(tmp_path: Path, meta: Path) -> None:
    out = tmp_path / "p"
    cli("plan", meta, out, *BASE, "--cost", "flops", "--model-preset", "qwen2.5-0.5b")
    cli("replan", out, tmp_path / "kept", "--from-step", 1, "--dp", 4, "-q")
    assert load_plan(tmp_path / "kept").meta["config"]["model_preset"] == "qwen2.5-0.5b"
    d = _config(tmp_path, "mistral-7b-v0.1")
    cli("replan", out, tmp_path / "other", "--from-step", 1, "--model", d, "-q")
    config = load_plan(tmp_path / "other").meta["config"]
    assert config["model"] == preset_spec("mistral-7b-v0.1").to_dict()
    assert config["model_preset"] is None
    cli("replan", out, tmp_path / "dims", "--from-step", 1, "--hidden", 64, "--kv-hidden", 16,
        "--layers", 2, "-q")  # fmt: skip
    config = load_plan(tmp_path / "dims").meta["config"]
    assert "model" not in config and config["hidden"] == 64
    assert cli("validate", tmp_path / "other", "--parent", out).stdout.startswith("OK ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cost", "flops", "--model", "no/such"], "--model no/such: no such file"),
        (["--cost", "flops"], "needs the model it prices"),
        (["--model", "qwen2.5-0.5b"], "--model is only used by --cost flops"),
        (["--cost", "flops", "--model", "qwen2.5-0.5b", "--hidden", 8, "--kv-hidden", 8,
          "--layers", 1], "--hidden conflicts with --model"),
    ],
)  # fmt: skip
def test_model_mistakes_are_one_line(tmp_path: Path, meta: Path, args, message) -> None:  # type: ignore[no-untyped-def]
    res = cli("plan", meta, tmp_path / "x", *BASE, *args, expect=2)
    (line,) = res.stderr.strip().splitlines()
    assert message in line and not (tmp_path / "x").exists()


def test_a_bad_config_json_names_its_file(tmp_path: Path, meta: Path) -> None:
    d = tmp_path / "bad"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64}))
    res = cli("plan", meta, tmp_path / "x", *BASE, "--cost", "flops", "--model", d, expect=2)
    assert f"{d / 'config.json'}: no num_hidden_layers" in res.stderr


FOUR = ["--cost", "time", "--time-per-linear-flop", "2e-15", "--time-per-attention-flop",
        "7e-15", "--time-per-sequence", "4e-4", "--time-per-micro-batch", "3e-3"]  # fmt: skip


def test_the_four_term_time_model_plans_validates_and_replays(tmp_path: Path, meta: Path) -> None:
    out = tmp_path / "p"
    cli("plan", meta, out, *BASE, "--pad-multiple", 64, "--model-preset", "qwen2.5-0.5b", *FOUR)
    config = load_plan(out).meta["config"]
    assert config["time_per_linear_flop"] == 2e-15 and config["time_per_micro_batch"] == 3e-3
    assert "time_per_flop" not in config and "time_fixed" not in config
    assert cli("validate", out).stdout.startswith("OK ")
    replay = cli("validate", out, "--metadata", meta, "--replay")
    assert replay.stdout.startswith("OK ") and "same rows" in replay.stdout
    cli("replan", out, tmp_path / "r", "--from-step", 1, "--dp", 4, "-q")
    assert load_plan(tmp_path / "r").meta["config"]["time_per_sequence"] == 4e-4
    assert cli("validate", tmp_path / "r", "--parent", out).stdout.startswith("OK ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model-preset", "qwen2.5-0.5b", *FOUR, "--time-fixed", 1], "conflicts with --time-per-flop"),
        ([*FOUR, "--hidden", 64, "--kv-hidden", 16, "--layers", 2], "needs the model: --model"),
        (["--model-preset", "qwen2.5-0.5b", "--cost", "time", "--time-per-sequence", 1],
         "needs both --time-per-linear-flop"),
    ],
)  # fmt: skip
def test_four_term_mistakes_are_one_line(tmp_path: Path, meta: Path, args, message) -> None:  # type: ignore[no-untyped-def]
    res = cli("plan", meta, tmp_path / "x", *BASE, *args, expect=2)
    assert message in res.stderr and res.stderr.count("\n") == 1


def test_a_vision_language_config_plans_by_its_language_model(tmp_path: Path, meta: Path) -> None:
    text = {k: v for k, v in PRESET_CONFIGS["qwen2.5-0.5b"][1].items() if k != "model_type"}
    tower = {"depth": 2, "embed_dim": 32, "hidden_size": 896, "num_heads": 4}
    d = tmp_path / "vl"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2_vl", **text,
                                               "vision_config": tower}))  # fmt: skip
    res = cli("plan", meta, tmp_path / "a", *BASE, "--cost", "flops", "--model", d)
    assert "qwen2_vl: samples are costed by their language model's part" in res.stderr
    cli("plan", meta, tmp_path / "b", *BASE, "--cost", "flops", "--model-preset", "qwen2.5-0.5b")
    a, b = load_plan(tmp_path / "a").meta, load_plan(tmp_path / "b").meta
    assert a["config"]["model"] == {**b["config"]["model"], "model_type": "qwen2_vl"}
    assert a["stats"] == b["stats"]
