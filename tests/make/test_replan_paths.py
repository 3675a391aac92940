"""Every path of ``varpack replan`` crossed with the plan features: the child validates with its
parents and ``--metadata``, or the replan is refused in one line and writes nothing.

Paths: the steps kept (the identity, or dealt to other ranks), what is left planned again
(another dp x grad-accum, budget, layout, batching or LR option, and ``--rebalance`` where the
steps could be kept), from step 0, the middle and the last, and chains (a child of a child, kept
or planned again). Features: split pieces (full-budget, and shorter with positions continued),
``--oversize alone/drop``, ``--mix`` blends (shuffled and curriculum), ``--carry`` with
``--where``, ``--cp``, ``--pp``, ``--batching blocks`` and ``fixed``, the padded layout,
``--max-shapes``, epochs > 1 and the warm-up reorder. Each pair either must succeed or must be
refused with its reason (:data:`REFUSED`); only the last step, where a few samples are left,
may be refused for the data (too few to fill a step) instead of succeeding.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from testkit import cli, write_metadata

from varpack.errors import ConfigError
from varpack.make.remaining import Stream, check_twice
from varpack.plan.config import PlanConfig
from varpack.planfile.format import PLAN_JSON, load_plan, rank_file, sha256_file
from varpack.planfile.schema import CHECKSUM_KEY, FINGERPRINT_KEY, plan_checksum, plan_fingerprint

MIX = ("--mix", "web=0.5,code=0.3,books=0.2", "--source-column", "source", "--oversize", "drop")
FEATURES: dict[str, tuple[object, ...]] = {
    "shuffle-drop": ("--oversize", "drop"),
    "curriculum-alone": ("--order", "curriculum", "--oversize", "alone"),
    "split-epochs": ("--oversize", "split", "--epochs", 2),
    "split-short": (
        "--oversize",
        "split",
        "--split-len",
        300,
        "--split-positions",
        "continue",
        "--order",
        "curriculum",
    ),  # fmt: skip
    "mix": MIX,
    "mix-curriculum": (*MIX, "--order", "curriculum"),
    "mix-split": (*MIX[:-2], "--oversize", "split"),
    "carry-where": (
        "--carry",
        "source",
        "--where",
        "score > 0.3",
        "--oversize",
        "drop",
        "--epochs",
        2,
    ),  # fmt: skip
    "cp": ("--cp", 2, "--bucket-size", 1024, "--oversize", "drop"),
    "pp": ("--pp", 2, "--oversize", "drop"),
    "blocks": ("--batching", "blocks", "--block-len", 1024, "--oversize", "drop"),
    "fixed": ("--batching", "fixed", "--batch-size", 4),
    "padded": ("--layout", "padded", "--oversize", "drop"),
    "max-shapes": ("--max-shapes", 4, "--oversize", "drop"),
    "reorder-split": ("--warmup", "reorder", "--oversize", "split", "--epochs", 2),
}
PATHS: dict[str, tuple[object, ...]] = {
    "identity": (),
    "reshard": ("--dp", 4),
    "rebalance": ("--dp", 4, "--rebalance"),
    "again": ("--dp", 3),
    "budget": ("--max-tokens", 2048),
    "layout": ("--layout", "padded"),
    "blocks": ("--batching", "blocks"),
    "lr": ("--lr-scaling", "sqrt", "--base-batch-size", 16),
}
KEPT = {"identity", "reshard"}
AGAIN = set(PATHS) - KEPT
_MIX_AGAIN = "a --mix plan is replanned only keeping dp x grad-accum"
_SHAPES_AGAIN = "--max-shapes chooses its lengths from the whole plan"
#: (feature, path) -> the reason it must be refused for
REFUSED: dict[tuple[str, str], str] = {
    **{(f, p): _MIX_AGAIN for f in ("mix", "mix-curriculum", "mix-split") for p in AGAIN},
    **{("max-shapes", p): _SHAPES_AGAIN for p in AGAIN},
    **{
        (f, "blocks"): "conflicts with --batching blocks"
        for f in ("split-epochs", "split-short", "reorder-split", "curriculum-alone", "mix-split")
    },  # fmt: skip
    ("pp", "reshard"): "must be a multiple of --pp",
    ("pp", "rebalance"): "must be a multiple of --pp",
    ("cp", "layout"): "conflicts with --layout padded",
    ("cp", "blocks"): "conflicts with --layout padded",
    ("fixed", "budget"): "--max-tokens conflicts with --batching fixed",
    ("fixed", "blocks"): "--batch-size conflicts with --batching blocks",
}
#: the warm-up reorder moves micro-batches across epochs (one of each shape to the front: in
#: the packed layout, most of them), so a piece may be left twice in the last epoch; steps
#: composed by cost could then put it beside itself: refused (the kept path is not)
REORDERED = "a piece is left twice in epoch"
#: a refusal allowed where a few samples are left (the last step): they cannot fill a step
FEW = ("cannot be planned so", "cannot fill one step")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("paths")
    rng = np.random.default_rng(1)
    n = 300
    lens = rng.integers(16, 900, n)
    lens[:6] = rng.integers(1100, 2600, 6)  # over the budget: dropped, alone or split
    write_metadata(root / "meta" / "m.parquet", rng.permutation(10 * n)[:n], lens,
                   source=np.array(["web", "code", "books"])[rng.integers(0, 3, n)],
                   score=rng.random(n))  # fmt: skip
    return root


_PLANS: dict[str, Path] = {}


def _plan(work: Path, feature: str) -> Path:
    """The feature's plan on dp 2 x grad-accum 2 (made once per module)."""
    out = work / feature
    if feature not in _PLANS:
        budget = () if feature in ("fixed", "cp") else ("--max-tokens", 1024)
        cli("plan", work / "meta", out, "--order", "shuffle", "--dp", 2, "--grad-accum", 2,
            *budget, *FEATURES[feature], "-q")  # fmt: skip
        _PLANS[feature] = out
    return out


def _replan(parent: Path, out: Path, step: int, opts: tuple[object, ...]) -> str | None:
    """``varpack replan``: ``None`` when the child validates with its parents (and the
    metadata), else the refusal, checked to be one line with nothing written."""
    res = cli("replan", parent, out, "--from-step", step, *opts, "-q", expect=None)
    if res.exit_code:
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("varpack: error: "), res.stderr
        assert not out.exists()
        return lines[0]
    got = cli("validate", out, "--metadata", out.parent / "meta", expect=None)
    assert got.exit_code == 0, got.output
    return None


def _steps(plan: Path) -> tuple[int, int]:
    p = load_plan(plan)
    return p.first_step, p.num_steps


@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("path", list(PATHS))
def test_each_path_validates_or_is_refused_in_one_line(work: Path, feature: str, path: str) -> None:
    parent = _plan(work, feature)
    first, n = _steps(parent)
    # the middle step, and the first or the last by turns (every path meets both)
    edge = (
        first if (list(PATHS).index(path) + sorted(FEATURES).index(feature)) % 2 else first + n - 1
    )
    for at in (edge, first + n // 2):
        refused = _replan(parent, work / f"{feature}-{path}-{at}", at, PATHS[path])
        want = REFUSED.get((feature, path))
        if want is not None:
            assert refused is not None and want in refused, (at, refused)
        elif refused is not None:  # only the data may refuse: a few samples left, at the end
            reorder = feature == "reorder-split" and REORDERED in refused
            assert (at == first + n - 1 and any(w in refused for w in FEW)) or reorder, refused
            assert path in AGAIN


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_a_child_of_a_child_validates_over_the_three_plans(work: Path, feature: str) -> None:
    parent = _plan(work, feature)
    _, n = _steps(parent)
    child = work / f"{feature}-chain"
    kept = ("--dp", 1, "--grad-accum", 4) if feature != "pp" else ()
    assert _replan(parent, child, n // 3, kept) is None
    first, m = _steps(child)
    assert first == n // 3
    pp = feature == "pp"  # its child kept dp 2 x grad-accum 2 (a multiple of --pp 2)
    for name, opts in [
        ("kept", () if pp else ("--dp", 4, "--grad-accum", 1)),
        ("again", ("--grad-accum", 4 if pp else 2)),  # another global batch
    ]:
        refused = _replan(child, work / f"{feature}-chain-{name}", first + m // 2, opts)
        want = REFUSED.get((feature, "again")) if name == "again" else None
        if want is not None:
            assert refused is not None and want in refused
        elif feature == "reorder-split" and name == "again":
            assert refused is None or REORDERED in refused
        else:
            assert refused is None, refused


def test_from_step_out_of_the_plan_is_refused(work: Path) -> None:
    parent = _plan(work, "shuffle-drop")
    _, n = _steps(parent)
    for at in (n, n + 5):
        assert "has nothing left to replan" in str(_replan(parent, work / "past", at, ()))
    child = work / "from-mid"
    assert _replan(parent, child, n // 2, ("--dp", 3)) is None
    for at in (0, n // 2 - 1):  # steps the child does not hold (its parent's)
        refused = _replan(child, work / "before", at, ("--dp", 2))
        assert refused is not None and f"holds steps {n // 2} to" in refused


def _units(plan: Path, step: int) -> list[tuple[int, int, int]]:
    """Every planned (sample id, offset, length) of steps >= ``step``, sorted."""
    p = load_plan(plan)
    out = []
    for r in range(p.dp):
        t = p.rank_table(r)
        t = t.filter(pc.greater_equal(t.column("step"), step))
        ids = t.column("sample_ids").combine_chunks().values.to_pylist()
        lens = t.column("seq_lens").combine_chunks().values.to_pylist()
        offs = (
            t.column("sample_offsets").combine_chunks().values.to_pylist()
            if "sample_offsets" in t.column_names
            else [0] * len(ids)
        )
        out.extend(zip(ids, offs, lens, strict=True))
    return sorted(out)


@pytest.mark.parametrize("opts", [("--rebalance",), ("--dp", 3), ("--max-tokens", 1500)])
def test_split_pieces_planned_again_keep_their_offsets(
    work: Path, opts: tuple[object, ...]
) -> None:
    """A document's pieces straddle the step: what is left is exactly the parent's pieces from
    there (id, offset, length), planned again; none shares a micro-batch with another of its
    document (validate)."""
    parent = _plan(work, "split-short")
    _, n = _steps(parent)
    for at in (n // 4, n // 2):
        child = work / f"pieces-{opts[0]}-{at}"
        assert _replan(parent, child, at, opts) is None
        assert _units(child, at) == _units(parent, at)
        assert any(o > 0 for _, o, _ in _units(child, at))  # pieces past a document's start


def test_switching_to_blocks_fills_the_block_length_from_what_is_left(work: Path) -> None:
    parent = _plan(work, "shuffle-drop")
    child = work / "to-blocks"
    assert _replan(parent, child, 3, ("--batching", "blocks")) is None
    cfg = json.loads((child / PLAN_JSON).read_text())["config"]
    longest = max(length for _, _, length in _units(parent, 3))
    assert cfg["block_len"] == longest and cfg["blocks_per_batch"] == 1024 // longest


def test_a_smaller_budget_sends_the_long_samples_left_alone(work: Path) -> None:
    """``--oversize alone`` planned again for a smaller budget: the samples now over it go alone
    and the child lists them (validate lets exactly those exceed the budget)."""
    parent = _plan(work, "curriculum-alone")
    child = work / "alone-smaller"
    assert _replan(parent, child, 2, ("--max-tokens", 700)) is None
    alone = json.loads((child / PLAN_JSON).read_text())["stats"]["oversize_alone"]
    over = sorted({i for i, _, n in _units(parent, 2) if n > 700})
    assert alone == over and over


def _reseal(plan: Path, change: Any) -> None:
    """Change plan.json, with its fingerprint and checksum made to fit (a consistent forgery)."""
    doc = json.loads((plan / PLAN_JSON).read_text())
    change(doc)
    doc[FINGERPRINT_KEY] = plan_fingerprint(doc)
    doc[CHECKSUM_KEY] = plan_checksum(doc)
    (plan / PLAN_JSON).write_text(json.dumps(doc, indent=2))


def test_a_mix_child_is_checked_by_the_blend_over_its_lineage(work: Path) -> None:
    """Kept steps keep the blend; a child whose rows trade a sample for one of another source,
    or that records another blend, fails by the blend's rules, not by once-per-epoch."""
    parent = _plan(work, "mix")
    _, n = _steps(parent)
    child = work / "mix-forged"
    assert _replan(parent, child, n // 2, ("--dp", 4)) is None
    path = child / rank_file(0)
    rows = pq.read_table(path).to_pylist()
    first = rows[0]
    other = next(
        (i, length, s)
        for r in _rows_of(parent)
        for i, length, s in zip(r["sample_ids"], r["seq_lens"], r["carry.source"], strict=True)
        if s != first["carry.source"][0]
    )
    first["sample_ids"][0], first["seq_lens"][0], first["carry.source"][0] = other
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(path)), path)
    _reseal(child, lambda doc: doc["ranks"][0].update(sha256=sha256_file(path)))
    out = cli("validate", child, expect=1).stdout
    assert "mix: source" in out and "plan.json says" in out
    assert "once" not in out and "missing from the plan" not in out
    _reseal(child, lambda doc: doc["mix"].update(tolerance=0.5))
    assert "mix: plan.json's blend is not the one of" in cli("validate", child, expect=1).stdout


def _rows_of(plan: Path) -> list[dict[str, Any]]:
    p = load_plan(plan)
    return [row for r in range(p.dp) for row in p.rank_table(r).to_pylist()]


def _per_epoch(plan: Path) -> list[list[tuple[int, int]]]:
    """Each epoch's planned units (sample id, offset), by the steps plan.json gives it."""
    doc = json.loads((plan / PLAN_JSON).read_text())
    p = load_plan(plan)
    rows = [row for r in range(p.dp) for row in p.rank_table(r).to_pylist()]
    out = []
    for e in doc["epochs"]:
        lo, hi = e["first_step"], e["first_step"] + e["num_steps"]
        out.append([(i, o) for row in rows if lo <= row["step"] < hi
                    for i, o in zip(row["sample_ids"], row["sample_offsets"], strict=True)])  # fmt: skip
    return out


def test_a_reordered_plans_epochs_are_planned_again_without_a_unit_twice(work: Path) -> None:
    """The warm-up reorder moved micro-batches across the parent's epochs, so the steps of its
    first epoch hold pieces of the second twice; planned again, each epoch holds each once."""
    root = _plan(work, "reorder-split")
    assert any(len(set(units)) < len(units) for units in _per_epoch(root))
    kept = work / "reorder-kept"  # its rows are the root's: the child of a reordered plan
    assert _replan(root, kept, 0, ("--dp", 4)) is None
    for parent in (root, kept):
        child = work / f"{parent.name}-again"
        assert _replan(parent, child, 0, ("--dp", 3)) is None
        assert all(len(set(units)) == len(units) for units in _per_epoch(child))


def test_a_piece_left_twice_is_refused_where_steps_are_composed_by_cost() -> None:
    """Composed by cost, full-budget pieces never share a micro-batch, but a short piece left
    twice in one epoch (more times than epochs are left) could sit beside itself."""
    stream = Stream(1, np.array([7, 7, 9]), np.array([40, 40, 100]), np.array([100, 100, 0]))
    costed = PlanConfig(max_tokens=100, oversize="split", order="shuffle").resolved()
    with pytest.raises(ConfigError, match="a piece is left twice in epoch 1"):
        check_twice(stream, costed)
    check_twice(dataclasses.replace(stream, ids=np.array([7, 8, 9])), costed)
    greedy = PlanConfig(max_tokens=100, oversize="split", split_len=50).resolved()
    check_twice(stream, greedy)  # the greedy batcher keeps a document's pieces apart


@pytest.mark.parametrize(
    ("feature", "opts", "limit"),
    [
        ("shuffle-drop", ("--max-tokens", 600), "--max-tokens 600"),
        ("shuffle-drop", ("--batching", "blocks", "--block-len", 512), "--block-len 512"),
        ("blocks", ("--block-len", 600, "--max-tokens", 1200), "--block-len 600"),
    ],
)
def test_a_remaining_sample_that_fits_no_micro_batch_is_refused(
    work: Path, feature: str, opts: tuple[object, ...], limit: str
) -> None:
    """The planner would drop it (``--oversize drop``) and the run would miss it: refused,
    naming it, whichever option makes it not fit."""
    refused = _replan(_plan(work, feature), work / "unfit", 1, opts)
    assert (
        refused is not None and f"{limit}: sample" in refused and "fits no micro-batch" in refused
    )
