"""varpack cost: a model's FLOPs per sample from its config.json, a directory or a preset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from testkit import cli

from varpack.plan.models import PRESET_CONFIGS, preset_spec
from varpack.plan.models.flops import train_flops


def _write(path: Path, config: dict[str, object]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_json_gives_each_length_split_into_linear_and_attention(tmp_path: Path) -> None:
    res = cli("cost", "qwen2.5-0.5b", "--lengths", "1024,32768", "--lengths", "7", "--json")
    got = json.loads(res.stdout)
    spec = preset_spec("qwen2.5-0.5b")
    assert got["source"] == "preset qwen2.5-0.5b (Qwen/Qwen2.5-0.5B)"
    assert got["digest"] == spec.digest() and got["spec"] == spec.to_dict()
    assert got["passes"] == 3 and got["crossover"] == 22970
    assert [r["length"] for r in got["flops"]] == [1024, 32768, 7]
    want = train_flops(np.array([1024, 32768, 7]), spec)
    for r, lin, att in zip(got["flops"], want.linear, want.attention, strict=True):
        assert set(r) == {"length", "linear", "attention", "total"}
        assert (r["linear"], r["attention"]) == (lin, att)
        assert r["total"] == pytest.approx(lin + att, rel=1e-15)
    # Qwen2.5-0.5B's 32 K sample costs 74 x its 1 K one (Skrull's formula: 212 x)
    assert got["flops"][1]["total"] / got["flops"][0]["total"] == pytest.approx(74.3, abs=0.1)


def test_a_config_file_or_its_directory_costs_as_the_preset(tmp_path: Path) -> None:
    repo, fields = PRESET_CONFIGS["mistral-7b-v0.1"]
    d = _write(tmp_path / "mistral", {**fields, "rope_theta": 10000.0, "architectures": ["x"]})
    by_dir = json.loads(cli("cost", d, "--json", "--lengths", "4096,100000").stdout)
    by_file = json.loads(
        cli("cost", d / "config.json", "--json", "--lengths", "4096,100000").stdout
    )
    preset = json.loads(cli("cost", "mistral-7b-v0.1", "--json", "--lengths", "4096,100000").stdout)
    assert by_dir["flops"] == by_file["flops"] == preset["flops"]
    assert by_dir["source"] == by_file["source"] == str(d / "config.json")
    assert by_dir["crossover"] is None  # every layer slides over 4096 keys


def test_text_names_the_model_and_the_crossover() -> None:
    out = cli("cost", "Qwen2.5-7B", "--lengths", "1024").stdout.splitlines()
    assert out[0].startswith("preset qwen2.5-7b (Qwen/Qwen2.5-7B): qwen2: 28 layers, hidden 3584")
    assert "3 x the forward" in out[1]
    assert out[2].split() == ["length", "linear", "attention", "total"]
    assert out[3].split()[0] == "1,024"
    assert out[-1] == "attention overtakes the linear layers from 70,454 tokens on"
    window = cli("cost", "mistral-7b-v0.1", "--lengths", "1").stdout.splitlines()[-1]
    assert window.startswith("attention never overtakes") and "window caps it" in window
    default = cli("cost", "gemma-2-2b").stdout.splitlines()
    assert [line.split()[0] for line in default[3:-1]] == [
        "1,024", "4,096", "16,384", "32,768", "65,536", "131,072"]  # fmt: skip


def test_an_unknown_model_type_is_costed_with_a_note(tmp_path: Path) -> None:
    d = _write(tmp_path / "m", {"model_type": "newformer", "hidden_size": 64,
                                "num_hidden_layers": 2, "num_attention_heads": 4,
                                "intermediate_size": 96, "vocab_size": 100})  # fmt: skip
    res = cli("cost", d, "--lengths", "16")
    assert res.stdout.startswith(f"{d / 'config.json'}: newformer: 2 layers")
    (note,) = res.stderr.strip().splitlines()
    assert note.startswith("note: ") and "'newformer' is not one varpack knows" in note


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (lambda p: p / "nothing", (), "neither a file, a directory holding a config.json, nor a"),
        (lambda p: p, (), "holds no config.json"),
        (lambda p: _write(p / "a", {"model_type": "llama", "hidden_size": 8}), (),
         "config.json: no num_hidden_layers"),
        (lambda p: _write(p / "b", {**PRESET_CONFIGS["qwen3-8b"][1], "num_hidden_layers": -2}),
         (), "config.json: num_hidden_layers is -2"),
        (lambda p: (p / "c.json").write_text("{oops") and p / "c.json", (), "c.json: not JSON"),
        (lambda p: "qwen2.5-0.5b", ("--lengths", "0"), "--lengths '0'"),
        (lambda p: "qwen2.5-0.5b", ("--lengths", "1024,x"), "--lengths 'x'"),
    ],
)  # fmt: skip
def test_what_it_cannot_cost_is_one_line(tmp_path: Path, make, args, message) -> None:  # type: ignore[no-untyped-def]
    res = cli("cost", make(tmp_path), *args, expect=2)
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("varpack: error: ") and message in line, line


QWEN2_VL = {
    "model_type": "qwen2_vl", "hidden_size": 1536, "intermediate_size": 8960,
    "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
    "vocab_size": 151936, "tie_word_embeddings": True,
    "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16,
                      "in_chans": 3, "hidden_size": 1536, "patch_size": 14,
                      "spatial_merge_size": 2, "temporal_patch_size": 2},
}  # fmt: skip


def test_patches_give_the_vision_tower_its_part(tmp_path: Path) -> None:
    from varpack.plan.models import spec_from_config
    from varpack.plan.models.vision import vision_from_config, vision_train_flops

    path = _write(tmp_path / "vl", QWEN2_VL)
    got = json.loads(cli("cost", path, "--lengths", "2048", "--patches", "1024,4096",
                         "--json").stdout)  # fmt: skip
    vision = vision_from_config(QWEN2_VL)
    assert vision is not None
    assert got["spec"] == spec_from_config(QWEN2_VL).to_dict()
    assert got["vision_spec"] == vision.to_dict()
    want = vision_train_flops(np.array([1024, 4096]), vision)
    assert [r["patches"] for r in got["vision"]] == [1024, 4096]
    assert [r["linear"] for r in got["vision"]] == pytest.approx(want.linear.tolist(), rel=1e-12)
    assert [r["attention"] for r in got["vision"]] == pytest.approx(want.attention.tolist())
    text = cli("cost", path, "--lengths", "2048", "--patches", "1024", "--patches", "4096").stdout
    assert "qwen2_vl vision: 32 blocks, embed 1280" in text
    assert "the sample (2 image(s), 5,120 patches) at each length:" in text
    # the sample's total is the text part plus the tower's, and the share is the tower's
    row = text.strip().splitlines()[-1].split()
    text_part, tower, total = float(row[1]), float(row[2]), float(row[3])
    assert total == pytest.approx(text_part + tower, rel=1e-3)
    assert tower == pytest.approx(float(want.total.sum()), rel=1e-3)


@pytest.mark.parametrize(
    ("target", "patches", "message"),
    [
        ("qwen2.5-0.5b", "100", "has no vision tower varpack costs"),
        (None, "0", "--patches '0'"),
        (None, "12,x", "--patches 'x'"),
        (None, "\u0663", "--patches"),
        (None, "1024,6", "--patches 6: an image's patches are a multiple of 4"),
    ],
)
def test_bad_patches_are_one_line(tmp_path: Path, target: str | None, patches: str,
                                  message: str) -> None:  # fmt: skip
    path = target or _write(tmp_path / "vl", QWEN2_VL)
    res = cli("cost", path, "--patches", patches, expect=2)
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("varpack: error: ") and message in line, line
