"""The kernel warm-up of ``make test`` (``tests/warm_kernels.py``) still plans every family: an
option renamed or refused there would leave its kernels to be compiled by the tests again."""

from __future__ import annotations

from pathlib import Path

from warm_kernels import families, warm


def test_every_warm_up_family_plans(tmp_path: Path) -> None:
    assert warm(tmp_path, "all") == []
    assert {p.name for p in tmp_path.iterdir()} >= {name for name, _ in families("all")}
    assert (tmp_path / "t.arrow").is_file()  # the token copy's kernels warmed too


def test_the_two_parts_share_the_families_out() -> None:
    composed, others = ({n for n, _ in families(p)} for p in ("composed", "others"))
    assert composed and others and not composed & others
    assert composed | others == {n for n, _ in families("all")}
