"""Every artifact varpack writes and reads is checked like plan.json: a schema, checksums, names
confined to the artifact's directory, refusal in one line. The sort index and the single-file
header (a hand-edited ``parts``, a part path outside the output, a flipped record), plan.json
(its own checksum, a plan of an earlier format version read and validated, a newer one refused)
and the torch loader's resume state."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit import cli, write_metadata

from varpack.errors import InputError
from varpack.plan.config import PlanConfig
from varpack.plan.context import OPTIONAL_KEYS
from varpack.planfile.format import PLAN_VERSION, VERSION, load_plan
from varpack.planfile.schema import ADDED, CHECKSUM_KEY
from varpack.sort import read_sorted
from varpack.sort.output import (
    CHECKSUM,
    HEADER_BYTES,
    INDEX,
    MAGIC,
    doc_checksum,
    make_index,
    write_part,
)
from varpack.validate import validate_plan

DATA = Path(__file__).resolve().parents[1] / "data"
OLD_PLAN, OLD_INPUT = DATA / "plan-v1", DATA / "plan-v1-input.parquet"


def _plan(source: Path) -> Any:
    """``varpack plan SOURCE`` that must fail (exit 2) and write nothing."""
    out = source.parent / "never"
    res = cli("plan", source, out, "--dp", 2, "--max-tokens", 512, expect=2)
    assert not out.exists()
    return res


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("varpack: error: "), stderr
    return lines[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Metadata, its sort output in both forms, and a plan of it (never changed: copy first)."""
    root = tmp_path_factory.mktemp("built")
    rng = np.random.default_rng(3)
    write_metadata(root / "meta.parquet", rng.permutation(60) * 7, rng.integers(1, 300, 60))
    cli("sort", root / "meta.parquet", root / "sorted", "-q")
    cli("sort", root / "meta.parquet", root / "sorted.bin", "--single-file", "-q")
    cli("plan", root / "sorted.bin", root / "plan", "--dp", 2, "--max-tokens", 512, "-q")
    return root


@pytest.fixture
def work(built: Path, tmp_path: Path) -> Path:
    """A private copy of the built artifacts."""
    shutil.copytree(built, tmp_path / "w")
    return tmp_path / "w"


def _edit_index(out: Path, change: Callable[[dict[str, Any]], None], seal: bool = True) -> None:
    """Change ``_index.json`` as a hand edit would (``seal``: its checksum recomputed to fit)."""
    index = json.loads((out / INDEX).read_text())
    change(index)
    if seal:
        index[CHECKSUM] = doc_checksum(index)
    (out / INDEX).write_text(json.dumps(index, indent=1))


# --- the sort index -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, want",
    [
        (lambda d: d.update(parts={"file": "part-00000.parquet"}), "parts: expected a list"),
        (lambda d: d["parts"].__setitem__(0, "part-00000.parquet"), "parts[0]: expected an object"),
        (lambda d: d["parts"][0].update(rows="60"), "parts[0].rows: expected an integer"),
        (lambda d: d["parts"][0].pop("sha256"), "parts[0]: missing key 'sha256'"),
        (lambda d: d["parts"][0].update(offset=3), "parts[0].offset is integer 3, expected 0"),
        (lambda d: d.update(num_rows=61), "the parts hold 60 rows, num_rows says 61"),
        (lambda d: d.update(columns={"sample_id": "int64"}), "sample_id and seq_len"),
        (lambda d: d.update(order=["sample_id"]), "order: expected the keys then sample_id"),
        (lambda d: d.update(descending=["difficulty"]), "descending: expected a list of key"),
        (lambda d: d.update(version=3), "newer than this varpack reads (1 to 2); upgrade varpack"),
        (lambda d: d.update(format="varpack.plan"), "unsupported format 'varpack.plan'"),
    ],
)
def test_a_hand_edited_index_is_one_line(work: Path, change: Any, want: str) -> None:
    _edit_index(work / "sorted", change)
    with pytest.raises(InputError, match=re.escape(want)):
        read_sorted(work / "sorted")
    line = _one_line(_plan(work / "sorted").stderr)
    assert INDEX in line and "rerun `varpack sort`" in line


def test_an_index_changed_after_the_sort_fails_its_checksum(work: Path) -> None:
    _edit_index(work / "sorted", lambda d: d.update(fingerprint="n60-t1-0"), seal=False)
    with pytest.raises(InputError, match="checksum does not match the content"):
        read_sorted(work / "sorted")


def test_an_index_of_version_1_is_still_read(work: Path) -> None:
    def older(index: dict[str, Any]) -> None:
        index.update(version=1)
        del index[CHECKSUM]

    want, _ = read_sorted(work / "sorted")
    _edit_index(work / "sorted", older, seal=False)
    table, index = read_sorted(work / "sorted")
    assert table.equals(want) and index["version"] == 1


@pytest.mark.parametrize("where", ["../victim.parquet", "absolute", "sub/part-00000.parquet"])
def test_a_part_outside_the_output_is_never_opened_nor_deleted(work: Path, where: str) -> None:
    out = work / "sorted"
    victim = work / "victim.parquet"
    shutil.copy(out / "part-00000.parquet", victim)
    before = victim.read_bytes()
    name = str(victim) if where == "absolute" else where
    _edit_index(out, lambda d: d["parts"][0].update(file=name))
    with pytest.raises(InputError, match="never a path"):
        read_sorted(out)
    line = _one_line(_plan(out).stderr)
    assert "parts[0].file" in line
    # --overwrite of that output does not trust its index, and never touches what it points at
    result = cli("sort", work / "meta.parquet", out, "--overwrite", "-q", expect=2)
    if where != "sub/part-00000.parquet":  # a sub-directory lies inside: named as foreign
        assert "outside the output, so it is damaged" in result.stderr
    assert victim.read_bytes() == before and (out / "_index.json").exists()


def test_a_part_that_is_a_symlink_is_refused(work: Path) -> None:
    out = work / "sorted"
    outside = work / "elsewhere.parquet"
    (out / "part-00000.parquet").rename(outside)
    (out / "part-00000.parquet").symlink_to(outside)
    with pytest.raises(InputError, match="is a symlink, not opened"):
        read_sorted(out)


def test_parts_are_read_in_their_own_order_only(tmp_path: Path) -> None:
    """Two parts swapped in the index (offsets fixed up, checksum resealed) are refused: a part
    is named by its place, so the global order cannot be rearranged by the index."""
    out = tmp_path / "s"
    out.mkdir()
    ids = np.arange(10)
    t = pa.table({"sample_id": ids, "seq_len": ids + 1})
    sha = [
        write_part(t.slice(0, 4), out / "part-00000.parquet"),
        write_part(t.slice(4), out / "part-00001.parquet"),
    ]
    meta = {
        "keys": ["seq_len"],
        "descending": [],
        "order": ["seq_len", "sample_id"],
        "columns": {"sample_id": "int64", "seq_len": "int64"},
        "total_tokens": int((ids + 1).sum()),
        "fingerprint": "x",
    }
    names = ["part-00001.parquet", "part-00000.parquet"]
    (out / INDEX).write_text(json.dumps(make_index(meta, names, [6, 4], sha[::-1])))
    with pytest.raises(InputError, match=r"parts\[0\].file is string \"part-00001.parquet\""):
        read_sorted(out)


# --- the single-file output ----------------------------------------------------------------------


def test_a_flipped_record_is_caught_and_validate_says_so(work: Path) -> None:
    path = work / "sorted.bin"
    assert validate_plan(work / "plan", _reference(path)).problems == []
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 8] ^= 1  # the first record's seq_len, one bit
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match="records' sha256 does not match the header"):
        read_sorted(path)
    line = _one_line(cli("validate", work / "plan", "--metadata", path, expect=2).stderr)
    assert "sorted.bin" in line and "rerun `varpack sort`" in line
    _one_line(_plan(path).stderr)


def _reference(path: Path) -> tuple[np.ndarray, np.ndarray]:
    from varpack.make import read_input

    return read_input(path)


def _header(path: Path) -> dict[str, Any]:
    head = path.read_bytes()[:HEADER_BYTES]
    doc: dict[str, Any] = json.loads(head[len(MAGIC) :].decode())
    return doc


def _write_header(path: Path, doc: dict[str, Any]) -> None:
    text = json.dumps(doc, separators=(",", ":")).encode()
    head = MAGIC + text + b" " * (HEADER_BYTES - len(MAGIC) - 1 - len(text)) + b"\n"
    path.write_bytes(head + path.read_bytes()[HEADER_BYTES:])


@pytest.mark.parametrize(
    "change, want",
    [
        (lambda d: d.update(num_rows=59), "checksum does not match the content"),
        (lambda d: d.update(dtype=[["sample_id", "<i8"]]), "sample_id and seq_len must come"),
        (lambda d: d.update(record_bytes="16"), "record_bytes: expected 16"),
        (lambda d: d.update(sha256=None), "sha256: expected the records' sha256"),
        (lambda d: d.update(version=1), "version 1, which carries no checksum of its records"),
        (lambda d: d.update(version=9), "newer than this varpack reads"),
    ],
)
def test_a_damaged_header_is_one_line(work: Path, change: Any, want: str) -> None:
    path = work / "sorted.bin"
    doc = _header(path)
    change(doc)
    _write_header(path, doc)
    with pytest.raises(InputError, match=want):
        read_sorted(path)
    assert want in _one_line(_plan(path).stderr)


def test_a_version_1_single_file_names_the_command_that_rewrites_it(work: Path) -> None:
    path = work / "sorted.bin"
    doc = {k: v for k, v in _header(path).items() if k not in ("sha256", CHECKSUM)}
    _write_header(path, {**doc, "version": 1})
    line = _one_line(_plan(path).stderr)
    assert "version 1" in line and "rerun `varpack sort --single-file`" in line


# --- plan.json ------------------------------------------------------------------------------------


@pytest.fixture
def old_plan(tmp_path: Path) -> Path:
    shutil.copytree(OLD_PLAN, tmp_path / "plan-v1")
    return tmp_path / "plan-v1"


def test_a_plan_of_an_earlier_version_is_read_and_validated(old_plan: Path) -> None:
    """A plan kept from format version 1 (tests/data/README.md): read by every reader and
    validated against its input; only --replay, whose planner has changed since, is refused."""
    plan = load_plan(old_plan, verify=True, full=True)
    assert plan.meta["version"] == 1 and "balance_fill" not in plan.meta["config"]
    assert plan.rank_table(1).num_rows == plan.num_steps * plan.grad_accum
    res = cli("validate", old_plan, "--metadata", OLD_INPUT)
    assert res.stdout.startswith("OK ") and ": 24 samples -> " in res.stdout
    assert "padding" in cli("inspect", old_plan).stdout
    line = _one_line(
        cli("validate", old_plan, "--metadata", OLD_INPUT, "--replay", expect=2).stderr
    )
    assert "plan.json is version 1" in line and "re-run varpack plan" in line


def test_a_plan_of_an_earlier_version_replays_through_the_torch_reader(old_plan: Path) -> None:
    pytest.importorskip("torch")
    from varpack.torch import PlanLoader

    table = pq.read_table(OLD_INPUT).to_pydict()
    data = {i: np.arange(n) for i, n in zip(table["sample_id"], table["seq_len"], strict=True)}
    loaders = [PlanLoader(old_plan, data, rank=r) for r in range(2)]
    seen = [int(i) for loader in loaders for b in loader for i in b.sample_ids]
    assert sorted(seen) == sorted(data)


def test_a_plan_of_a_newer_version_is_refused(old_plan: Path, built: Path) -> None:
    doc = json.loads((built / "plan" / "plan.json").read_text())
    assert doc["version"] == PLAN_VERSION  # a plan of varpack plan (a replanned one: VERSION)
    (old_plan / "plan.json").write_text(json.dumps({**doc, "version": VERSION + 1}))
    line = _one_line(cli("validate", old_plan, expect=2).stderr)
    assert f"plan version {VERSION + 1} was written by a newer varpack" in line
    assert "upgrade varpack" in line


def test_every_plan_key_is_known_to_a_version(built: Path) -> None:
    """A new plan.json key (a config option, a figure) must be recorded in schema.ADDED with a
    new format version, or plans written before it would fail validate's schema check."""
    old = json.loads((OLD_PLAN / "plan.json").read_text())
    added = {k.split(".")[-1] for k in ADDED if k.startswith("config.")}
    options = {f.name for f in dataclasses.fields(PlanConfig)}
    unknown = options - set(old["config"]) - OPTIONAL_KEYS - added
    assert not unknown, f"record these options in varpack.planfile.schema.ADDED: {unknown}"
    assert max(ADDED.values()) <= VERSION
    new = json.loads((built / "plan" / "plan.json").read_text())
    for key in ADDED:
        where, _, name = key.rpartition(".")
        if key not in ("parent", "selection", "mix"):  # only plans of those features hold them
            assert name in (new[where] if where else new), key
    stats = {k.split(".")[-1] for k in ADDED if k.startswith("stats.")}
    assert set(new["stats"]) - set(old["stats"]) <= stats | {"budget_fill"}


def test_plan_json_is_sealed_by_its_checksum(work: Path) -> None:
    """An edit that no recomputation would see (a figure within validate's tolerance) is caught
    by plan.json's checksum, in every reader."""
    path = work / "plan" / "plan.json"
    doc = json.loads(path.read_text())
    doc["stats"]["mixing"] *= 1 + 1e-9
    path.write_text(json.dumps(doc, indent=2))
    with pytest.raises(InputError, match=f"plan.json {CHECKSUM_KEY} does not match its content"):
        load_plan(work / "plan")
    assert f"{CHECKSUM_KEY} does not match" in _one_line(
        cli("inspect", work / "plan", expect=2).stderr
    )
    assert (
        f"plan.json {CHECKSUM_KEY} does not match"
        in cli("validate", work / "plan", expect=1).stdout
    )


# --- the torch loader's resume state -------------------------------------------------------------


@pytest.fixture
def loader(built: Path) -> Any:
    pytest.importorskip("torch")
    from varpack.torch import PlanLoader

    table = pq.read_table(built / "meta.parquet").to_pydict()
    data = {i: np.arange(n) for i, n in zip(table["sample_id"], table["seq_len"], strict=True)}
    return PlanLoader(built / "plan", data, rank=0)


def test_the_loader_state_is_sealed(loader: Any) -> None:
    from varpack.torch.state import state_checksum

    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert state["checksum"] == state_checksum(state) and state["step"] == 2
    loader.load_state_dict(json.loads(json.dumps(state)))  # a JSON round trip keeps it
    with pytest.raises(InputError, match="checksum does not match its content"):
        loader.load_state_dict({**state, "step": 1})  # in range, but not what was saved
    with pytest.raises(InputError, match="not a dict"):
        loader.load_state_dict([state])
    with pytest.raises(InputError, match="written by a newer varpack"):
        loader.load_state_dict({**state, "version": 3})
    with pytest.raises(InputError, match="checksum does not match"):
        loader.load_state_dict(
            {**state, "version": 1}
        )  # a checksum is checked whatever the version
    older = {k: v for k, v in state.items() if k != "checksum"}
    loader.load_state_dict({**older, "version": 1})  # written before states had a checksum
    assert next(iter(loader)).step == 2


def test_a_state_of_a_replanned_run_names_the_plan(
    loader: Any, built: Path, tmp_path: Path
) -> None:
    cli("plan", built / "sorted", tmp_path / "again", "--dp", 2, "--max-tokens", 1024, "-q")
    from varpack.torch import PlanLoader

    other = PlanLoader(tmp_path / "again", loader.dataset.dataset, rank=0)
    assert other.num_steps != loader.num_steps
    with pytest.raises(InputError, match="belongs to another plan"):
        loader.load_state_dict(other.state_dict())
