"""The ground floor: atomic outputs and fingerprints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from varpack.atomic import atomic_dir, check_output
from varpack.errors import OutputError, OutputExistsError
from varpack.fingerprint import fingerprint


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
    with pytest.raises(OutputError, match="not an output varpack wrote"):
        check_output(out, overwrite=True)  # a directory varpack did not write is never replaced
    with atomic_dir(tmp_path / "ours", marker="test") as tmp:
        (tmp / "new.txt").write_text("new")
    with atomic_dir(tmp_path / "ours", overwrite=True, marker="test") as tmp:
        (tmp / "newer.txt").write_text("newer")
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == ["_varpack.json", "newer.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours", "out"]


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
