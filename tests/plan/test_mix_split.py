"""Blends of long documents: ``plan --mix`` with ``--oversize split``.

The blend draws whole documents (a document drawn twice brings all its pieces twice, a
subsample draws whole documents), each piece keeps its document's source, and every token of
every drawn document is planned. Each test reads the manifests back and checks the pieces
against the metadata itself, beside ``varpack validate``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit import cli

BUDGET = 2048
PLAN = ("--max-tokens", BUDGET, "--dp", 2, "--grad-accum", 4, "--cost", "flops",
        "--model-preset", "qwen2.5-0.5b", "--source-column", "source", "-q")  # fmt: skip


def write_long(path: Path, n: int, seed: int, long_share: float = 0.3) -> Path:
    """Three sources: web (log-normal, some over the budget), books (mostly 1 to 6 budgets),
    code (short), with metadata columns ``score`` and ``source``."""
    rng = np.random.default_rng(seed)
    src = rng.choice(["web", "books", "code"], n, p=[0.5, 0.2, 0.3])
    books = np.where(rng.random(n) < long_share, rng.integers(BUDGET + 1, 6 * BUDGET, n),
                     rng.integers(200, BUDGET, n))  # fmt: skip
    lens = np.where(src == "web", rng.lognormal(6.5, 0.9, n).clip(1, 4 * BUDGET),
                    np.where(src == "books", books, rng.integers(20, 1500, n)))  # fmt: skip
    pq.write_table(pa.table({"sample_id": np.arange(n, dtype=np.int64) * 7 + 3,
                             "seq_len": lens.astype(np.int64), "source": src,
                             "score": rng.random(n)}), path)  # fmt: skip
    return path


def planned(plan: Path) -> dict[str, np.ndarray]:
    """Every planned row of every rank: sample id, length, offset, source, micro-batch, step."""
    tables = [pq.read_table(f) for f in sorted(plan.glob("rank-*.parquet"))]
    out: dict[str, list[np.ndarray]] = {k: [] for k in ("id", "len", "off", "src", "row", "step")}
    rows = 0
    for t in tables:
        ids = t.column("sample_ids").combine_chunks()
        count = np.diff(ids.offsets.to_numpy())
        out["id"].append(ids.flatten().to_numpy())
        out["len"].append(t.column("seq_lens").combine_chunks().flatten().to_numpy())
        offs = (t.column("sample_offsets").combine_chunks().flatten().to_numpy()
                if "sample_offsets" in t.column_names else np.zeros(int(count.sum()), np.int64))  # fmt: skip
        out["off"].append(offs)
        out["src"].append(np.asarray(t.column("carry.source").combine_chunks().flatten()
                                     .to_pylist()))  # fmt: skip
        out["row"].append(np.repeat(np.arange(rows, rows + t.num_rows), count))
        out["step"].append(np.repeat(t.column("step").to_numpy(), count))
        rows += t.num_rows
    return {k: np.concatenate(v) for k, v in out.items()}


def drawn_documents(plan: Path, meta: Path, split_len: int = BUDGET) -> dict[int, tuple[int, str]]:
    """Each planned document, as (times drawn, source), checked against the metadata: its
    pieces tile it exactly, each as often, with its source; no piece above ``split_len``; no
    two different pieces of one document in one micro-batch."""
    ref = pq.read_table(meta).to_pydict()
    length = dict(zip(ref["sample_id"], ref["seq_len"], strict=True))
    source = dict(zip(ref["sample_id"], ref["source"], strict=True))
    p = planned(plan)
    assert p["len"].max() <= split_len
    pieces: dict[int, dict[int, list[int]]] = {}
    for i, n, f, s in zip(p["id"].tolist(), p["len"].tolist(), p["off"].tolist(),
                          p["src"].tolist(), strict=True):  # fmt: skip
        assert s == source[i], (i, s)  # a piece carries its document's source
        pieces.setdefault(i, {}).setdefault(f, []).append(n)
    out = {}
    for i, by_off in pieces.items():
        times = {len(v) for v in by_off.values()}
        assert len(times) == 1, (i, by_off)  # a document is drawn whole
        end = 0
        for f in sorted(by_off):
            assert f == end and len(set(by_off[f])) == 1, (i, by_off)  # tiles, one length
            end += by_off[f][0]
        assert end == length[i], (i, end, length[i])  # every token of the document
        out[i] = (times.pop(), source[i])
    key = np.lexsort((p["off"], p["id"], p["row"]))
    same = (p["row"][key][1:] == p["row"][key][:-1]) & (p["id"][key][1:] == p["id"][key][:-1])
    assert not (same & (p["off"][key][1:] != p["off"][key][:-1])).any()  # pieces kept apart
    return out


def _doc(plan: Path) -> dict:
    return json.loads((plan / "plan.json").read_text())


def test_a_blend_of_long_documents_plans_every_kept_token(tmp_path: Path) -> None:
    """Weights at the sources' own token shares and a total of all their tokens: every token of
    every document is planned once (with --oversize drop the long ones are lost), the shares
    are the weights, and validate with the metadata passes (mixture and piece checks)."""
    meta = write_long(tmp_path / "m.parquet", 3000, 1)
    ref = pq.read_table(meta).to_pydict()
    lens, src = np.array(ref["seq_len"]), np.array(ref["source"])
    total = int(lens.sum())
    weights = {s: float(lens[src == s].sum()) / total for s in ("web", "books", "code")}
    mix = ",".join(f"{k}={v!r}" for k, v in weights.items())
    args = (*PLAN, "--order", "shuffle", "--mix", mix, "--total-tokens", total)
    cli("plan", meta, tmp_path / "split", *args, "--oversize", "split")
    docs = drawn_documents(tmp_path / "split", meta)
    assert len(docs) == 3000 and {t for t, _ in docs.values()} == {1}  # each once, whole
    doc = _doc(tmp_path / "split")
    for name, w in weights.items():
        assert doc["mix"]["sources"][name]["planned_tokens"] == round(w * total)
    assert doc["stats"]["tokens"]["kept_share"] == 1.0
    out = cli("validate", tmp_path / "split", "--metadata", meta).stdout
    assert out.startswith("OK") and "3,000 samples drawn by --mix from 3,000 (" in out
    cli("plan", meta, tmp_path / "again", *args, "--oversize", "split")  # the same bytes
    for f in (tmp_path / "split").iterdir():
        assert f.read_bytes() == (tmp_path / "again" / f.name).read_bytes(), f.name
    cli("plan", meta, tmp_path / "drop", *args, "--oversize", "drop")
    lost = _doc(tmp_path / "drop")["stats"]["tokens"]["dropped_share"]
    assert lost > 0.1  # what the blend of whole documents used to lose


@pytest.mark.parametrize("order", ["shuffle", "curriculum"])
def test_split_holds_the_shares_as_the_blend_without_split(tmp_path: Path, order: str) -> None:
    """Weights far from the sources' proportions: each source's share of the planned tokens is
    its weight within one document (one sample without split), and the steps hold the targets
    about as well as the blend that drops the long documents."""
    meta = write_long(tmp_path / "m.parquet", 4000, 2)
    weights = {"web": 0.3, "books": 0.5, "code": 0.2}
    mix = ",".join(f"{k}={v}" for k, v in weights.items())
    longest = int(pq.read_table(meta).column("seq_len").to_numpy().max())
    args = (*PLAN, "--order", order, "--mix", mix, "--total-tokens", 4_000_000)
    held = {}
    for how, slack in (("split", longest), ("drop", BUDGET)):
        cli("plan", meta, tmp_path / how, *args, "--oversize", how, "--mix-tolerance", 0.05)
        doc = _doc(tmp_path / how)
        planned_total = sum(f["planned_tokens"] for f in doc["mix"]["sources"].values())
        for name, w in weights.items():
            got = doc["mix"]["sources"][name]["planned_tokens"]
            assert 0 <= got - w * 4_000_000 < slack + 1, (how, name, got)
            assert abs(got / planned_total - w) < slack / planned_total * 3, (how, name)
            if order == "shuffle":
                assert abs(doc["mix"]["shares"][name]["mean"] - got / planned_total) < 0.01
        held[how] = doc["mix"]["steps"]
        assert cli("validate", tmp_path / how, "--metadata", meta).stdout.startswith("OK")
    drawn_documents(tmp_path / "split", meta)
    if order == "shuffle":  # composed by cost: most steps within 5 points, with or without split
        for how in held:
            assert held[how]["within"] >= 0.8 * held[how]["steps"], held


def test_a_document_drawn_twice_brings_all_its_pieces_twice(tmp_path: Path) -> None:
    """books repeated (x1.7), code subsampled: every document of a source is drawn k or k + 1
    times, whole; every book at least once, a code file at most once."""
    meta = write_long(tmp_path / "m.parquet", 1500, 3, long_share=0.6)
    ref = pq.read_table(meta).to_pydict()
    lens, src = np.array(ref["seq_len"]), np.array(ref["source"])
    total = int(1.7 * lens[src == "books"].sum() / 0.9)
    assert 0.1 * total < lens[src == "code"].sum()  # code is subsampled
    cli("plan", meta, tmp_path / "p", *PLAN, "--order", "shuffle", "--oversize", "split",
        "--mix", "books=0.9,code=0.1", "--total-tokens", total)  # fmt: skip
    docs = drawn_documents(tmp_path / "p", meta)
    books = np.array(ref["sample_id"])[src == "books"]
    times = np.array([docs.get(i, (0, ""))[0] for i in books.tolist()])
    assert times.min() == 1 and times.max() == 2
    code = [t for t, s in docs.values() if s == "code"]
    assert set(code) == {1} and len(code) < (src == "code").sum()
    fig = _doc(tmp_path / "p")["mix"]["sources"]["books"]
    assert fig["planned_samples"] == times.sum() and 1.6 < fig["repeat"] < 1.8
    assert fig["planned_pieces"] > fig["planned_samples"]
    assert cli("validate", tmp_path / "p", "--metadata", meta).stdout.startswith("OK")


def test_a_blend_by_samples_counts_documents(tmp_path: Path) -> None:
    """--mix-unit samples: a source's share counts its documents, however many pieces each."""
    meta = write_long(tmp_path / "m.parquet", 2000, 4, long_share=0.8)
    cli("plan", meta, tmp_path / "p", *PLAN, "--order", "shuffle", "--oversize", "split",
        "--mix", "books=0.5,web=0.25,code=0.25", "--mix-unit", "samples",
        "--total-samples", 1600)  # fmt: skip
    docs = drawn_documents(tmp_path / "p", meta)
    doc = _doc(tmp_path / "p")
    for name, w in {"books": 0.5, "web": 0.25, "code": 0.25}.items():
        assert sum(t for t, s in docs.values() if s == name) == 1600 * w
        assert doc["mix"]["sources"][name]["planned_samples"] == 1600 * w
    out = cli("validate", tmp_path / "p", "--metadata", meta).stdout
    assert out.startswith("OK") and ": 1,600 samples drawn by --mix from 2,000 (" in out


@pytest.mark.parametrize("order", ["shuffle", "curriculum"])
def test_pieces_shorter_than_the_budget_stay_apart(tmp_path: Path, order: str) -> None:
    """--split-len below the budget (the greedy batcher, which could put two pieces in one
    micro-batch): no two different pieces of a document share one, copies drawn included."""
    meta = write_long(tmp_path / "m.parquet", 1200, 5, long_share=0.7)
    cli("plan", meta, tmp_path / "p", *PLAN, "--order", order, "--oversize", "split",
        "--split-len", 600, "--mix", "books=0.6,code=0.4", "--total-tokens", 6_000_000)  # fmt: skip
    docs = drawn_documents(tmp_path / "p", meta, split_len=600)
    assert max(t for t, _ in docs.values()) >= 2
    assert cli("validate", tmp_path / "p", "--metadata", meta).stdout.startswith("OK")


def test_a_selection_then_a_blend_of_pieces(tmp_path: Path) -> None:
    """--where first, then the blend of the kept documents' pieces."""
    meta = write_long(tmp_path / "m.parquet", 2000, 6)
    cli("plan", meta, tmp_path / "p", *PLAN, "--order", "shuffle", "--oversize", "split",
        "--where", "score > 0.5", "--mix", "books=0.5,web=0.5")  # fmt: skip
    docs = drawn_documents(tmp_path / "p", meta)
    score = dict(zip(*pq.read_table(meta, columns=["sample_id", "score"]).to_pydict().values(),
                     strict=True))  # fmt: skip
    assert all(score[i] > 0.5 for i in docs)
    assert _doc(tmp_path / "p")["stats"]["tokens"]["documents_split"] > 0
    assert cli("validate", tmp_path / "p", "--metadata", meta).stdout.startswith("OK")


def test_sources_by_path_with_pieces(tmp_path: Path) -> None:
    """--source NAME=DIR: the same blend as the source column names it, byte for byte."""
    meta = write_long(tmp_path / "m.parquet", 1500, 7)
    table = pq.read_table(meta)
    for name in ("books", "code"):
        (tmp_path / "by" / name).mkdir(parents=True)
        part = table.filter(pc.equal(table.column("source"), name))
        pq.write_table(part.select(["sample_id", "seq_len"]), tmp_path / "by" / name / "0.parquet")
    both = pa.concat_tables(
        [pq.read_table(tmp_path / "by" / n / "0.parquet") for n in ("books", "code")]
    )
    pq.write_table(both, tmp_path / "all.parquet")
    opts = ("--max-tokens", BUDGET, "--dp", 2, "--grad-accum", 4, "--order", "shuffle",
            "--oversize", "split", "--mix", "books=0.6,code=0.4", "--total-tokens", 2_000_000, "-q")  # fmt: skip
    cli("plan", tmp_path / "all.parquet", tmp_path / "paths", *opts,
        "--source", f"books={tmp_path / 'by' / 'books'}", "--source", f"code={tmp_path / 'by' / 'code'}")  # fmt: skip
    docs = drawn_documents(tmp_path / "paths", meta)
    assert {s for _, s in docs.values()} == {"books", "code"}
    out = cli("validate", tmp_path / "paths", "--metadata", tmp_path / "all.parquet").stdout
    assert out.startswith("OK")


@given(
    n=st.integers(60, 400),
    long_share=st.floats(0.0, 0.9),
    raw=st.lists(st.floats(0.05, 1.0), min_size=3, max_size=3),
    factor=st.floats(0.2, 3.0),
    by_tokens=st.booleans(),
    curriculum=st.booleans(),
    short=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=15, deadline=None)
def test_every_drawn_document_is_planned_whole_with_its_source(
    tmp_path_factory: pytest.TempPathFactory, n: int, long_share: float, raw: list[float],
    factor: float, by_tokens: bool, curriculum: bool, short: bool, seed: int,
) -> None:  # fmt: skip
    """Random corpora, weights and totals (sources repeated or subsampled), both units, both
    orders, full-budget or shorter pieces: every drawn document's pieces tile it, as often as
    it was drawn, with its source; a source's documents are drawn k or k + 1 times; its share
    is what the weights give (by tokens: up to the document that reaches it); validate agrees."""
    tmp = tmp_path_factory.mktemp("split-mix")
    meta = write_long(tmp / "m.parquet", n, seed, long_share)
    ref = pq.read_table(meta).to_pydict()
    lens, src = np.array(ref["seq_len"]), np.array(ref["source"])
    w = np.array(raw) / sum(raw)
    w[-1] = 1 - w[:-1].sum()
    weights = dict(zip(["web", "books", "code"], w.tolist(), strict=True))
    unit = "tokens" if by_tokens else "samples"
    total = max(40, int(factor * (lens.sum() if by_tokens else n)))
    opts = ("--split-len", 700) if short else ()
    cli("plan", meta, tmp / "p", "--max-tokens", BUDGET, "--dp", 2, "--grad-accum", 2,
        "--source-column", "source", "--order", "curriculum" if curriculum else "shuffle",
        "--oversize", "split", *opts, "--mix", ",".join(f"{k}={v!r}" for k, v in weights.items()),
        "--mix-unit", unit, f"--total-{unit}", total, "--seed", seed, "-q")  # fmt: skip
    docs = drawn_documents(tmp / "p", meta, 700 if short else BUDGET)
    length = dict(zip(ref["sample_id"], ref["seq_len"], strict=True))
    for name, wt in weights.items():
        mine = [i for i, s in zip(ref["sample_id"], src.tolist(), strict=True) if s == name]
        times = np.array([docs.get(i, (0, ""))[0] for i in mine])
        assert times.max() - times.min() <= 1, name  # whole passes, then a subset
        share = round(wt * total)
        if by_tokens:
            got = int((times * lens[src == name]).sum())
            assert share <= got < share + max(length[i] for i in mine), (name, got, share)
        else:
            assert times.sum() == share, name
    assert cli("validate", tmp / "p", "--metadata", meta).stdout.startswith("OK")
