"""The plan's on-disk format: round trip, checksums, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from varpack.errors import InputError
from varpack.planfile.format import BASE_SCHEMA, load_plan, rank_file, write_plan


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


def test_a_signal_while_writers_are_joined_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal that interrupts the wait for the writer threads: the writers are waited for
    again before the temporary directory is removed, so none writes while it is removed."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import varpack.atomic as atomic
    import varpack.planfile.format as fmt

    writing = []  # writers at work now
    seen = []  # writers at work when the temporary was removed
    slow, drop = fmt._write_table, atomic.drop_temp

    def write_late(table, path):  # type: ignore[no-untyped-def]
        writing.append(path)
        time.sleep(0.3)  # still writing when the signal comes
        try:
            return slow(table, path)
        finally:
            writing.remove(path)

    def drop_and_look(tmp):  # type: ignore[no-untyped-def]
        seen.append(len(writing))
        drop(tmp)

    class Interrupted(ThreadPoolExecutor):
        calls = 0

        def shutdown(self, wait=True, *, cancel_futures=False):  # type: ignore[no-untyped-def]
            Interrupted.calls += 1
            if Interrupted.calls == 1:
                raise KeyboardInterrupt  # what the signal handler raises, before any join
            super().shutdown(wait=wait, cancel_futures=cancel_futures)

    monkeypatch.setattr(fmt, "_write_table", write_late)
    monkeypatch.setattr(fmt, "ThreadPoolExecutor", Interrupted)
    monkeypatch.setattr(atomic, "drop_temp", drop_and_look)
    meta = {"layout": {"dp": 2, "pp": 1, "cp": 1, "grad_accum": 1}, "num_steps": 3}
    with pytest.raises(KeyboardInterrupt):
        write_plan(tmp_path / "plan", meta, [_tiny_manifest(3), _tiny_manifest(3)])
    assert seen == [0]  # removed once, with no writer at work
    assert list(tmp_path.iterdir()) == []
