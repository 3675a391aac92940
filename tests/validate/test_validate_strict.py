"""`validate` is strict about the plan directory; `inspect` and the reader refuse in one line.

plan.json's keys and types, rank files as plain declared files inside the plan, unreadable rank
files, a config edited after planning (by the recorded fingerprint, or by re-planning with
``--replay``), the duplicate-sample message, and where ``inspect --plot`` may write.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import Result
from testkit import cli, write_metadata

from varpack.errors import InputError
from varpack.planfile.format import PLAN_JSON, _write_table, load_plan, rank_file, sha256_file
from varpack.planfile.schema import (
    CHECKSUM_KEY,
    FINGERPRINT_KEY,
    plan_checksum,
    plan_fingerprint,
)

OPTIONS = ["--max-tokens", 512, "--dp", 2, "--grad-accum", 2, "--order", "shuffle", "--seed", 1]
OPTIONS += ["--shuffle-window", 4]


@pytest.fixture
def meta(tmp_path: Path, rng: np.random.Generator) -> Path:
    return write_metadata(tmp_path / "meta.parquet", np.arange(700), rng.integers(1, 400, 700))


@pytest.fixture
def plan(tmp_path: Path, meta: Path) -> Path:
    out = tmp_path / "plan"
    cli("plan", meta, out, *OPTIONS, "--quiet")
    assert cli("validate", out).stdout.startswith("OK ")
    return out


def _edit(plan: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change plan.json in place (as a hand edit would)."""
    doc = json.loads((plan / PLAN_JSON).read_text())
    change(doc)
    (plan / PLAN_JSON).write_text(json.dumps(doc, indent=2))


def _violations(*args: object) -> str:
    """``varpack validate ARGS``: exit 1, one line per violation, no traceback."""
    res = cli("validate", *args, expect=1)
    assert "Traceback" not in res.output
    lines = res.stdout.strip().splitlines()
    assert lines and all(line.startswith("violation: ") for line in lines), res.stdout
    return res.stdout


def _one_line(res: Result) -> str:
    """The single ``varpack: error:`` line of a refused command."""
    assert "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("varpack: error: "), res.stderr
    return lines[0]


def _loader(plan: Path, **kwargs: Any) -> Any:
    """Open rank 1 of ``plan`` with the torch reader (the dataset is never reached)."""
    pytest.importorskip("torch.nn")
    from varpack.torch import PlanLoader

    return PlanLoader(plan, dataset=None, rank=1, **kwargs)


# --- plan.json's keys and types --------------------------------------------------------------------


def test_ranks_as_an_object(plan: Path) -> None:
    _edit(plan, lambda d: d.update(ranks={str(r["rank"]): r for r in d["ranks"]}))
    want = "plan.json ranks: expected a list of rank entries, found an object"
    assert want in _violations(plan)
    assert want in _one_line(cli("inspect", plan, expect=2))
    with pytest.raises(InputError, match=want):
        _loader(plan)


@pytest.mark.parametrize(
    "where, key", [("layout", "grad_accum"), (None, "num_steps"), ("input", "fingerprint")]
)
def test_missing_key(plan: Path, where: str | None, key: str) -> None:
    _edit(plan, lambda d: (d[where] if where else d).pop(key))
    place = f"plan.json {where}" if where else "plan.json"
    want = f"{place}: missing key '{key}'"
    assert want in _violations(plan)
    assert want in _one_line(cli("inspect", plan, expect=2))


@pytest.mark.parametrize(
    "path, value, want",
    [
        (("num_steps",), "12", 'num_steps: expected an integer >= 0, found the string "12"'),
        (("ranks", 0, "rows"), None, "ranks[0].rows: expected an integer >= 0, found null"),
        (("ranks", 1, "sha256"), 7, "ranks[1].sha256: expected a sha256"),
        (("stats", "mixing"), "high", "stats.mixing: expected a number"),
        (("config", "seed"), "1", "config.seed: expected an integer"),
        (("layout", "dp"), True, "layout.dp: expected an integer >= 1, found the boolean true"),
    ],
)
def test_wrong_type(plan: Path, path: tuple[Any, ...], value: Any, want: str) -> None:
    def change(doc: dict[str, Any]) -> None:
        at = doc
        for k in path[:-1]:
            at = at[k]
        at[path[-1]] = value

    _edit(plan, change)
    assert f"plan.json {want}" in _violations(plan)
    assert want in _one_line(cli("inspect", plan, expect=2))


# --- rank files: plain files inside the plan, exactly the declared set ------------------------------


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_rank_file_outside_the_plan(tmp_path: Path, plan: Path, how: str) -> None:
    outside = tmp_path / "x.parquet"
    shutil.move(plan / rank_file(1), outside)  # a good manifest, with the recorded sha256
    name = "../x.parquet" if how == "dotdot" else str(outside)
    _edit(plan, lambda d: d["ranks"][1].update(file=name))
    assert f"ranks[1].file {name!r} points outside the plan directory" in _violations(plan)
    assert "points outside" in _one_line(cli("inspect", plan, expect=2))


def test_symlink_leading_outside(tmp_path: Path, plan: Path) -> None:
    outside = tmp_path / "elsewhere.parquet"
    shutil.move(plan / rank_file(1), outside)
    (plan / rank_file(1)).symlink_to(outside)  # same bytes: every checksum still matches
    out = _violations(plan)
    assert f"rank 1 manifest is a symlink (to {outside}, outside the plan directory)" in out
    assert "symlink" in _one_line(cli("inspect", plan, expect=2))
    with pytest.raises(InputError, match="symlink"):
        _loader(plan, verify=False)


def test_undeclared_parquet_file(plan: Path) -> None:
    shutil.copy(plan / rank_file(0), plan / rank_file(2))
    assert f"{plan / rank_file(2)}: a manifest that plan.json does not declare" in _violations(plan)


def test_truncated_rank_file(plan: Path) -> None:
    path = plan / rank_file(1)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    violations = _violations(plan).strip().splitlines()
    assert len(violations) == 1 and f"{path}: rank 1 manifest is unreadable" in violations[0]
    assert "rank-00001.parquet" in _one_line(cli("inspect", plan, expect=2))
    with pytest.raises(InputError, match="rank 1 manifest is unreadable"):
        _loader(plan)
    with pytest.raises(InputError, match="rank 1 manifest is unreadable"):
        _loader(plan, verify=False)


def _reseal(doc: dict[str, Any]) -> None:
    """A consistent forgery: the plan fingerprint and plan.json's checksum made to fit."""
    doc[FINGERPRINT_KEY] = plan_fingerprint(doc)
    doc[CHECKSUM_KEY] = plan_checksum(doc)


@pytest.mark.parametrize("value", [None, "both", 1, ["micro"]])
def test_a_sync_that_is_no_model_is_refused_by_every_reader(plan: Path, value: Any) -> None:
    """plan.json's sync (checksums made to fit) is what the trainer's advice and inspect read:
    a value that names no model is refused on read, not shown as "None sync"."""
    _edit(plan, lambda d: (d["config"].update(sync=value), _reseal(d)))
    want = "plan.json config.sync: expected one of step, micro, found "
    assert want in _violations(plan)
    line = _one_line(cli("inspect", plan, expect=2))
    assert want in line and "None sync" not in line
    for full in (False, True):  # the torch reader's read, and inspect's
        with pytest.raises(InputError, match=want):
            load_plan(plan, verify=True, full=full)


@pytest.mark.parametrize("key", ["layout", "batching", "oversize"])
def test_a_null_option_the_torch_reader_reads_is_refused(plan: Path, key: str) -> None:
    _edit(plan, lambda d: (d["config"].update({key: None}), _reseal(d)))
    with pytest.raises(InputError, match=f"plan.json config.{key}: expected a string, found null"):
        load_plan(plan)
    assert f"config.{key}: expected a string, found null" in _violations(plan)


@pytest.mark.parametrize(
    "options, key, value",
    [
        (["--oversize", "split", "--split-len", 300], "split_len", 512),  # made with 300
        (["--cost", "flops", "--model-preset", "qwen2.5-0.5b"], "model_digest", "'sha256:"),
        (["--pack-to", 512], "max_tokens", 512),
    ],
)
def test_a_null_the_config_resolves_is_refused(
    tmp_path: Path, meta: Path, options: list[Any], key: str, value: object
) -> None:
    """plan.json holds the config resolved: a null that reading it fills in again (the split
    length, a preset's model and its digest, the budget --pack-to sets) claims another plan."""
    out = tmp_path / "nulled"
    base = OPTIONS[2:] if key == "max_tokens" else OPTIONS  # --pack-to sets the budget
    assert OPTIONS[:2] == ["--max-tokens", 512]
    cli("plan", meta, out, *base, *options, "-q")
    _edit(out, lambda d: (d["config"].update({key: None}), _reseal(d)))
    want = f"plan.json config.{key}: null, but the config resolves it to {value}"
    assert want in _violations(out)
    assert want in _one_line(cli("inspect", out, expect=2))


# --- the config reproduces the plan ---------------------------------------------------------------


@pytest.mark.parametrize("key, value", [("seed", 2), ("max_tokens", 1024), ("shuffle_window", 8)])
def test_edited_config_is_caught_without_metadata(plan: Path, key: str, value: int) -> None:
    _edit(plan, lambda d: d["config"].update({key: value}))
    out = _violations(plan)
    assert f"plan.json {FINGERPRINT_KEY} does not match its content" in out
    assert "its config (or input) was edited after planning" in out
    assert "re-run varpack plan" in out
    assert "edited after planning" in _one_line(cli("inspect", plan, expect=2))


def test_replay_catches_an_edit_the_fingerprint_cannot(plan: Path, meta: Path) -> None:
    def forge(doc: dict[str, Any]) -> None:  # edited config, fingerprint recomputed to fit
        doc["config"]["compose"] = "tokens"  # no stat depends on it (a new seed moves samples)
        doc[FINGERPRINT_KEY] = plan_fingerprint(doc)
        doc[CHECKSUM_KEY] = plan_checksum(doc)

    _edit(plan, forge)
    assert cli("validate", plan).exit_code == 0  # consistent as far as the plan itself tells
    out = _violations(plan, "--metadata", meta, "--replay")
    assert "replay: rank 0 " in out and "the re-planned manifest" in out
    assert "config did not make this plan" in out


def test_a_forged_seed_is_caught_by_the_moved_figures(plan: Path) -> None:
    def forge(doc: dict[str, Any]) -> None:
        doc["config"]["seed"] = 2
        doc[FINGERPRINT_KEY] = plan_fingerprint(doc)

    _edit(plan, forge)
    assert "moved_steps" in _violations(plan)


def test_replay_passes_on_an_untouched_plan(plan: Path, meta: Path) -> None:
    res = cli("validate", plan, "--metadata", meta, "--replay")
    assert res.stdout.startswith("OK ") and "re-planned with its config: same rows" in res.stdout


def test_plan_without_fingerprint_needs_replay(plan: Path, meta: Path) -> None:
    def without(doc: dict[str, Any]) -> None:  # as if written without one (checksum resealed)
        doc.pop(FINGERPRINT_KEY)
        doc[CHECKSUM_KEY] = plan_checksum(doc)

    _edit(plan, without)
    assert f"plan.json has no {FINGERPRINT_KEY}" in _violations(plan)
    cli("validate", plan, "--metadata", meta, "--replay")
    assert "--replay needs --metadata" in _one_line(cli("validate", plan, "--replay", expect=2))


# --- the duplicate-sample message ------------------------------------------------------------------


def test_duplicate_message_names_the_sample_and_where(plan: Path) -> None:
    rows0 = pq.read_table(plan / rank_file(0)).to_pylist()
    rows1 = pq.read_table(plan / rank_file(1)).to_pylist()
    dup, dup_len = rows0[3]["sample_ids"][0], rows0[3]["seq_lens"][0]
    rows1[5]["sample_ids"][0], rows1[5]["seq_lens"][0] = dup, dup_len
    path = plan / rank_file(1)
    table = pa.Table.from_pylist(rows1, schema=pq.read_schema(path))
    _write_table(table, path)

    def reseal(doc: dict[str, Any]) -> None:  # a consistent forgery: checksum and fingerprint
        doc["ranks"][1]["sha256"] = sha256_file(path)
        doc[FINGERPRINT_KEY] = plan_fingerprint(doc)

    _edit(plan, reseal)
    where = (
        f"sample {dup} at rank 0 step {rows0[3]['step']} row 3 and "
        f"rank 1 step {rows1[5]['step']} row 5"
    )
    assert f"epoch 0: 1 sample ids planned more than once: {where}" in _violations(plan)


# --- inspect --plot writes safely ------------------------------------------------------------------


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("where", ["inside", "plan", "input"])
def test_plot_refuses_the_plan_and_its_input(tmp_path: Path, plan: Path, where: str) -> None:
    before = _tree(tmp_path)
    target = {"inside": plan / "plot.png", "plan": plan, "input": tmp_path / "meta.parquet"}[where]
    res = cli("inspect", plan, "--plot", target, "--overwrite", expect=2)
    assert "input" in _one_line(res)
    assert res.stdout == ""  # refused before any work
    assert _tree(tmp_path) == before


def test_plot_over_an_existing_file_needs_overwrite(tmp_path: Path, plan: Path) -> None:
    png = tmp_path / "plot.png"
    cli("inspect", plan, "--plot", png)
    drawn = png.read_bytes()
    assert "pass --overwrite" in _one_line(cli("inspect", plan, "--plot", png, expect=2))
    assert png.read_bytes() == drawn
    png.write_bytes(b"x" + drawn[1:])  # an earlier figure, changed: still varpack's
    cli("inspect", plan, "--plot", png, "--overwrite")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.parquet", "plan", "plot.png"]
    png.write_bytes(b"mine")  # a file varpack did not draw is never replaced
    line = _one_line(cli("inspect", plan, "--plot", png, "--overwrite", expect=2))
    assert "not an output varpack wrote" in line and png.read_bytes() == b"mine"


def test_plot_is_written_atomically(tmp_path: Path, plan: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import errno

    from matplotlib.figure import Figure

    def full(self: Figure, fname: os.PathLike[str], **kwargs: Any) -> None:
        Path(fname).write_bytes(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    res = cli("inspect", plan, "--plot", tmp_path / "plot.png", expect=1)
    assert "disk is full" in _one_line(res)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.parquet", "plan"]


# --- -q / --quiet ---------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["-q", "--quiet"])
def test_quiet_says_nothing_on_success(plan: Path, meta: Path, flag: str) -> None:
    for extra in ([], ["--metadata", meta]):
        res = cli("validate", plan, *extra, flag)
        assert (res.stdout, res.stderr) == ("", "")


@pytest.mark.parametrize("flag", ["-q", "--quiet"])
def test_quiet_still_reports_every_violation(plan: Path, flag: str) -> None:
    path = plan / rank_file(1)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    shutil.copy(plan / rank_file(0), plan / rank_file(2))
    loud, quiet = cli("validate", plan, expect=1), cli("validate", plan, flag, expect=1)
    assert quiet.stdout == loud.stdout and quiet.stdout.count("violation: ") == 2
    assert quiet.stderr == loud.stderr == f"{plan}: 2 violations\n"


def test_quiet_still_says_why_it_cannot_validate(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert "plan.json" in _one_line(cli("validate", tmp_path / "empty", "-q", expect=2))
