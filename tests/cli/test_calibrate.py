"""varpack calibrate: the memory and time models recovered from measured rows; bad input."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from testkit import cli

from varpack.plan.config import PlanConfig
from varpack.plan.cost import sample_flops
from varpack.plan.models import PRESET_CONFIGS, PRESETS, preset_spec
from varpack.plan.models.flops import sample_train_flops


def _csv(path: Path, rows: Sequence[tuple[object, ...]], header: str) -> Path:
    path.write_text(header + "\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n")
    return path


def test_recovers_a_and_b_and_plans_with_them(tmp_path):
    tokens = np.array([512, 1024, 2048, 3000, 4096, 6000, 8192, 12000])
    flops = sample_train_flops(tokens, preset_spec("qwen2.5-0.5b"))
    rows = [(t, 3000 * t + 7e6, 2e-13 * f + 0.05) for t, f in zip(tokens, flops, strict=True)]
    src = _csv(tmp_path / "steps.csv", rows, "tokens,peak_memory,step_time")
    out = tmp_path / "calib.json"
    res = cli("calibrate", src, out, "--model-preset", "qwen2.5-0.5b", "--memory-capacity",
              str(10**9), "--holdout", "3")  # fmt: skip
    assert "bucket size" in res.stdout
    got = json.loads(out.read_text())
    assert got["memory_per_token"] == pytest.approx(3000) and got["memory_fixed"] == pytest.approx(
        7e6
    )
    assert got["time_per_flop"] == pytest.approx(2e-13) and got["time_fixed"] == pytest.approx(0.05)
    assert got["held_out"] == 2 and got["time_error_held_out"]["max_pct"] < 1e-6
    assert abs(got["bucket_size"] - (10**9 - 7_000_000) // 3000) <= 1  # float fit
    cfg = PlanConfig(
        cp=2, cost="time", model_preset="qwen2.5-0.5b", memory_capacity=10**9,
        **{k: got[k] for k in ("memory_per_token", "memory_fixed", "time_per_flop", "time_fixed")},
    ).resolved()  # fmt: skip
    assert cfg.bucket() == got["bucket_size"] and cfg.max_tokens == 2 * got["bucket_size"]


@pytest.mark.parametrize("how", ["file", "dir", "preset", "dims"])
def test_each_rows_flops_from_the_model_given(tmp_path, how):
    """--model CONFIG (a file, its directory, a preset name) counts the model's exact FLOPs;
    --hidden --kv-hidden --layers Skrull's approximation."""
    tokens = np.array([512, 2048, 4096, 16000, 32000])
    spec = preset_spec("mistral-7b-v0.1")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(PRESET_CONFIGS["mistral-7b-v0.1"][1]))
    d = PRESETS["mistral-7b-v0.1"]
    cases: dict[str, tuple[list[object], np.ndarray]] = {
        "file": (["--model", tmp_path / "m" / "config.json"], sample_train_flops(tokens, spec)),
        "dir": (["--model", tmp_path / "m"], sample_train_flops(tokens, spec)),
        "preset": (["--model", "mistral-7b-v0.1"], sample_train_flops(tokens, spec)),
        "dims": (["--hidden", d.hidden, "--kv-hidden", d.kv_hidden, "--layers", d.layers],
                 sample_flops(tokens, d)),
    }  # fmt: skip
    args, flops = cases[how]
    rows = [(t, 1e-12 * f + 0.5) for t, f in zip(tokens, flops, strict=True)]
    src = _csv(tmp_path / "steps.csv", rows, "tokens,step_time")
    cli("calibrate", src, tmp_path / "o.json", *args)
    got = json.loads((tmp_path / "o.json").read_text())
    assert got["time_per_flop"] == pytest.approx(1e-12) and got["time_fixed"] == pytest.approx(0.5)


def test_flops_column_and_memory_only(tmp_path):
    src = _csv(tmp_path / "a.csv", [(100, 1000, 2.0, 10), (200, 2000, 4.0, 20)],
               "tokens,peak_memory,step_time,flops")  # fmt: skip
    cli("calibrate", src, tmp_path / "o.json")
    got = json.loads((tmp_path / "o.json").read_text())
    assert got["time_per_flop"] == pytest.approx(0.2) and got["memory_per_token"] == pytest.approx(
        10
    )
    mem = _csv(tmp_path / "m.csv", [(100, 1000), (300, 2000)], "tokens,peak_memory")
    cli("calibrate", mem, tmp_path / "m.json")
    assert "time_per_flop" not in json.loads((tmp_path / "m.json").read_text())


@pytest.mark.parametrize(
    ("header", "rows", "extra", "message"),
    [
        ("size,peak_memory", [(1, 2), (2, 3)], [], "no 'tokens' column"),
        ("tokens,peak_memory", [(1, "x"), (2, 3)], [], ":2: peak_memory 'x' is not a number"),
        ("tokens,peak_memory", [(1, 5), (1, 6)], [], "at least two different sizes"),
        ("tokens,peak_memory", [(1, 9), (2, 5)], [], "does not grow with the work"),
        ("tokens,step_time", [(1, 9), (2, 5)], [], "step_time needs a flops column"),
        ("tokens,step_time", [(1, 9), (2, 5)], ["--hidden", "8"], "give all of --hidden"),
        (
            "tokens,step_time",
            [(1, 9), (2, 5)],
            ["--model", "qwen2.5-7b", "--model-preset", "qwen2.5-7b"],
            "give one model",
        ),
        ("tokens,step_time", [(1, 9), (2, 5)], ["--model", "nope"], "--model 'nope' is neither"),
        ("tokens,peak_memory", [(1, -1), (2, 5)], [], "must be finite and >= 0"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, header, rows, extra, message):
    src = _csv(tmp_path / "a.csv", rows, header)
    res = cli("calibrate", src, tmp_path / "o.json", *extra, expect=2)
    assert message in res.stderr and res.stderr.count("\n") == 1
    assert not (tmp_path / "o.json").exists()


def test_output_kept_apart(tmp_path):
    src = _csv(tmp_path / "a.csv", [(100, 1000), (300, 2000)], "tokens,peak_memory")
    (tmp_path / "o.json").write_text("{}")
    assert "exists" in cli("calibrate", src, tmp_path / "o.json", expect=2).stderr
    cli("calibrate", src, src, expect=2)
    assert src.read_text().startswith("tokens")


def _four_term_rows(n: int = 12) -> tuple[list[tuple[object, ...]], list[float]]:
    """Rows of a micro-batch CSV whose seconds are exactly the four-term model's."""
    coef = [2e-13, 5e-13, 3e-3, 2e-2]
    rng = np.random.default_rng(5)
    rows: list[tuple[object, ...]] = []
    for i in range(n):
        seqs = int(rng.integers(1, 9))
        tokens = int(rng.integers(1000, 30000))
        lin, att = 4e9 * tokens, 1e5 * tokens * tokens / seqs
        sec = coef[0] * lin + coef[1] * att + coef[2] * seqs + coef[3]
        rows.append((tokens, 900 * tokens + 5e6, sec, lin, att, seqs, "long" if i % 2 else "chat"))
    return rows, coef


def test_four_term_time_model_from_columns(tmp_path):
    rows, coef = _four_term_rows()
    src = _csv(tmp_path / "m.csv", rows,
               "tokens,peak_memory,step_time,linear_flops,attention_flops,samples,kind")  # fmt: skip
    out = tmp_path / "o.json"
    res = cli("calibrate", src, out, "--holdout", "3")
    got = json.loads(out.read_text())
    terms = ("time_per_linear_flop", "time_per_attention_flop", "time_per_sequence",
             "time_per_micro_batch")  # fmt: skip
    assert [got[t] for t in terms] == pytest.approx(coef, rel=1e-6)
    assert "time_per_flop" not in got and got["memory_per_token"] == pytest.approx(900)
    assert got["held_out"] == 4 and got["time_error_held_out"]["max_pct"] < 1e-6
    by_kind = got["time_error_held_out_by_kind"]
    assert set(by_kind) == {"chat", "long"} and [e["rows"] for e in by_kind.values()] == [2, 2]
    assert "by kind chat" in res.stdout and "long" in res.stdout
    assert got["flops_line"]["time_error_held_out"]["mean_pct"] > 0  # the old model, compared
    cfg = PlanConfig(cost="time", model_preset="qwen2.5-0.5b", max_tokens=8192,
                     **{t: got[t] for t in terms}).resolved()  # fmt: skip
    assert cfg.time_terms() == tuple(got[t] for t in terms)


def test_four_term_without_samples_or_kind_counts_one_sequence(tmp_path):
    rows, _ = _four_term_rows()
    src = _csv(tmp_path / "m.csv", [(r[0], r[2], r[3], r[4]) for r in rows],
               "tokens,step_time,linear_flops,attention_flops")  # fmt: skip
    res = cli("calibrate", src, tmp_path / "o.json", "--holdout", "3")
    got = json.loads((tmp_path / "o.json").read_text())
    assert list(got["time_error_held_out_by_kind"]) == ["all"] and "by kind" not in res.stdout
    assert got["time_per_sequence"] == 0.0 and "time_per_sequence" in got["terms_at_zero"]


@pytest.mark.parametrize(
    ("header", "extra", "message"),
    [
        ("tokens,step_time,linear_flops", [], "needs both linear_flops and attention_flops"),
        ("tokens,step_time,linear_flops,attention_flops", ["--holdout", "2"],
         "--holdout 2 leaves 3 rows to fit"),
        ("tokens,step_time,linear_flops,attention_flops,kind", [], "attention_flops 'x'"),
    ],
)  # fmt: skip
def test_four_term_bad_input_is_one_line(tmp_path, header, extra, message):
    rows, _ = _four_term_rows(6)
    if header.endswith("kind"):
        rows = [(r[0], r[2], r[3], "x", r[6]) for r in rows]
    else:
        rows = [(r[0], r[2], r[3], r[4])[: header.count(",") + 1] for r in rows]
    src = _csv(tmp_path / "a.csv", rows, header)
    res = cli("calibrate", src, tmp_path / "o.json", *extra, expect=2)
    assert message in res.stderr and res.stderr.count("\n") == 1
    assert not (tmp_path / "o.json").exists()


def test_four_term_from_each_rows_lengths_and_a_model(tmp_path):
    """A lengths column costed by the model's config gives the same fit as the FLOP columns
    counted by hand, sample by sample."""
    from varpack.plan.models.flops import train_flops

    spec = preset_spec("qwen2.5-0.5b")
    coef = [2e-13, 5e-13, 3e-3, 2e-2]
    rng = np.random.default_rng(3)
    by_lengths, by_columns = [], []
    for i in range(12):
        lens = rng.integers(1, 9000, int(rng.integers(1, 7)))
        f = train_flops(lens, spec)
        lin, att = float(f.linear.sum()), float(f.attention.sum())
        sec = coef[0] * lin + coef[1] * att + coef[2] * len(lens) + coef[3]
        tokens = int(lens.sum()) + 16 * (i % 3)  # padding counts as tokens
        kind = "long" if i % 2 else "chat"
        by_lengths.append((tokens, sec, " ".join(map(str, lens)), kind))
        by_columns.append((tokens, sec, lin, att, len(lens), kind))
    a = _csv(tmp_path / "a.csv", by_lengths, "tokens,step_time,lengths,kind")
    b = _csv(tmp_path / "b.csv", by_columns,
             "tokens,step_time,linear_flops,attention_flops,samples,kind")  # fmt: skip
    cli("calibrate", a, tmp_path / "a.json", "--model-preset", "qwen2.5-0.5b", "--holdout", "3")
    cli("calibrate", b, tmp_path / "b.json", "--holdout", "3")
    got, want = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "ab")
    terms = ("time_per_linear_flop", "time_per_attention_flop", "time_per_sequence",
             "time_per_micro_batch")  # fmt: skip
    assert [got[t] for t in terms] == pytest.approx(coef, rel=1e-6)
    assert {k: v for k, v in got.items() if k != "source"} == {
        k: v for k, v in want.items() if k != "source"
    }


@pytest.mark.parametrize(
    ("header", "row", "extra", "message"),
    [
        ("tokens,step_time,lengths", (900, 1.0, "400 x"), ["--model-preset", "qwen2.5-0.5b"],
         "lengths '400 x' must be the row's sample lengths"),
        ("tokens,step_time,lengths", (900, 1.0, "0 5"), ["--model-preset", "qwen2.5-0.5b"],
         "lengths '0 5' must be"),
        ("tokens,step_time,lengths", (900, 1.0, "40 \u00b2"), ["--model-preset", "qwen2.5-0.5b"],
         "must be the row's sample lengths"),
        ("tokens,step_time,lengths", (300, 1.0, "400 100"), ["--model-preset", "qwen2.5-0.5b"],
         "tokens 300 is less than the row's lengths add up to (500)"),
        ("tokens,step_time,lengths", (900, 1.0, "400 100"), [],
         "a lengths column is costed by a model's config"),
        ("tokens,step_time,lengths", (900, 1.0, "400 100"), ["--hidden", "8", "--kv-hidden", "8",
         "--layers", "2"], "a lengths column is costed by a model's config"),
        ("tokens,step_time,lengths,flops", (900, 1.0, "400 100", 5.0),
         ["--model-preset", "qwen2.5-0.5b"], "drop the flops, linear_flops"),
    ],
)  # fmt: skip
def test_lengths_column_bad_input_is_one_line(tmp_path, header, row, extra, message):
    src = _csv(tmp_path / "a.csv", [row, row], header)
    res = cli("calibrate", src, tmp_path / "o.json", *extra, expect=2)
    assert message in res.stderr and res.stderr.count("\n") == 1
    assert not (tmp_path / "o.json").exists()


def test_lengths_beside_memory_alone_need_no_model(tmp_path):
    rows = [
        (1000, 9e5 + 5e6, "600 400"),
        (3000, 2.7e6 + 5e6, "3000"),
        (2000, 1.8e6 + 5e6, "1 1999"),
    ]
    src = _csv(tmp_path / "m.csv", rows, "tokens,peak_memory,lengths")
    cli("calibrate", src, tmp_path / "o.json")
    got = json.loads((tmp_path / "o.json").read_text())
    assert got["memory_per_token"] == pytest.approx(900) and "time_per_linear_flop" not in got
