"""The shared spine: atomic outputs, fingerprints, the manifest format and CLI error handling."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from varpack.atomic import atomic_dir, check_output
from varpack.errors import InputError, OutputExistsError
from varpack.fingerprint import fingerprint
from varpack.manifest import BASE_SCHEMA, load_plan, rank_file, write_plan


def test_atomic_dir_publishes_only_on_success(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_dir(out) as tmp:
        (tmp / "half.txt").write_text("x")
        raise RuntimeError("boom")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # the temporary directory is gone too


def test_atomic_dir_refuses_existing_output_unless_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        check_output(out, overwrite=False)
    with atomic_dir(out, overwrite=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2**62), st.integers(1, 2**20)),
        min_size=1,
        max_size=50,
        unique_by=lambda t: t[0],
    ),
    st.randoms(use_true_random=False),
)
def test_fingerprint_is_order_and_split_independent(pairs: list[tuple[int, int]], rnd) -> None:
    ids = np.array([p[0] for p in pairs], dtype=np.int64)
    lens = np.array([p[1] for p in pairs], dtype=np.int64)
    whole = fingerprint(ids, lens)
    perm = np.array(rnd.sample(range(len(ids)), len(ids)))
    cut = rnd.randint(0, len(ids))
    parts = fingerprint(ids[perm][:cut], lens[perm][:cut]) + fingerprint(
        ids[perm][cut:], lens[perm][cut:]
    )
    assert parts == whole
    assert whole.count == len(ids) and whole.tokens == int(lens.sum())


def test_fingerprint_sees_a_changed_length() -> None:
    ids = np.arange(100)
    lens = np.full(100, 7)
    changed = lens.copy()
    changed[42] = 8
    swapped = lens.copy()
    swapped[[1, 2]] = [6, 8]  # same count and token total, different pairs
    assert fingerprint(ids, lens).hex != fingerprint(ids, changed).hex
    assert fingerprint(ids, lens).hex != fingerprint(ids, swapped).hex


def _tiny_manifest(steps: int) -> pa.Table:
    return pa.table(
        {
            "step": pa.array(range(steps), pa.int64()),
            "micro": pa.array([0] * steps, pa.int32()),
            "sample_ids": pa.array([[i] for i in range(steps)], pa.list_(pa.int64())),
            "seq_lens": pa.array([[5]] * steps, pa.list_(pa.int32())),
            "pad_to": pa.array([5] * steps, pa.int32()),
            "lr_factor": pa.array([1.0] * steps, pa.float64()),
            "step_tokens": pa.array([5] * steps, pa.int64()),
            "step_samples": pa.array([1] * steps, pa.int64()),
            "warmup": pa.array([False] * steps),
        },
        schema=BASE_SCHEMA,
    )


def test_manifest_roundtrip_and_tamper_detection(tmp_path: Path) -> None:
    meta = {"layout": {"dp": 2, "pp": 1, "cp": 1, "grad_accum": 1}, "num_steps": 3}
    plan_dir = write_plan(tmp_path / "plan", meta, [_tiny_manifest(3), _tiny_manifest(3)])
    plan = load_plan(plan_dir, verify=True)
    assert plan.dp == 2 and plan.num_steps == 3
    assert plan.rank_table(1).schema == BASE_SCHEMA
    doc = json.loads((plan_dir / "plan.json").read_text())
    assert [r["file"] for r in doc["ranks"]] == [rank_file(0), rank_file(1)]

    # Same tables -> byte-identical files.
    again = write_plan(tmp_path / "again", meta, [_tiny_manifest(3), _tiny_manifest(3)])
    assert (again / rank_file(0)).read_bytes() == (plan_dir / rank_file(0)).read_bytes()

    # A changed rank file is refused.
    other = write_plan(tmp_path / "other", meta, [_tiny_manifest(4), _tiny_manifest(4)])
    (plan_dir / rank_file(1)).write_bytes((other / rank_file(1)).read_bytes())
    with pytest.raises(InputError, match="sha256"):
        load_plan(plan_dir).rank_table(1)
    with pytest.raises(InputError, match="rank 5 is outside"):
        load_plan(plan_dir).rank_table(5)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"format": "other"}, "format"),
        ({"version": 99}, "version 99"),
        ({"layout": {"dp": 3, "pp": 1, "cp": 1, "grad_accum": 1}}, "dp does not match"),
    ],
)
def test_load_plan_refuses_wrong_format_version_layout(tmp_path: Path, edit, message) -> None:
    meta = {"layout": {"dp": 1, "pp": 1, "cp": 1, "grad_accum": 1}, "num_steps": 2}
    plan_dir = write_plan(tmp_path / "plan", meta, [_tiny_manifest(2)])
    doc = json.loads((plan_dir / "plan.json").read_text())
    doc.update(edit)
    (plan_dir / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=message):
        load_plan(plan_dir)


def test_load_plan_on_a_non_plan(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a varpack plan"):
        load_plan(tmp_path)


def test_cli_user_error_is_one_line_exit_2(tmp_path: Path) -> None:
    """A user mistake prints exactly one line on stderr, no traceback, exit code 2."""
    proc = subprocess.run(
        [sys.executable, "-m", "varpack", "check", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("varpack: error:") and "missing" in lines[0]
    assert "Traceback" not in proc.stderr
