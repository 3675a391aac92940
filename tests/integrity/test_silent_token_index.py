"""The token copy and its index never give a wrong token: the right tokens, or one line.

The copy (``varpack lengths --arrow-copy``) and its location index ``.idx`` are fuzzed like the
other artifacts (``test_fuzz.py``): a flipped bit in every region of the index (header, its
padding, ids, each field of the records: start, length, check value; the fence, the id blocks'
values, the chunk values of long samples, the record batches' digests) and anywhere in the copy,
either file cut short, a stale copy of the same size (two samples of the same length swapped,
another dataset's tokens, sample ids or sample bounds rewritten in place), an index beside the
wrong copy, an index of version 1 or 2. For each, a whole split plan replayed
through ``PlanLoader`` (pieces of long samples verified chunk by chunk), by ``pread`` and through
a map, gives exactly the undamaged batches or raises one :class:`~varpack.errors.InputError` line.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit import cli

from varpack.errors import InputError
from varpack.metadata import token_check, token_index
from varpack.metadata.token_index import (
    BATCH,
    BLOCK,
    HEADER,
    RECORD,
    index_path,
    token_positions,
)

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from varpack.torch import ParquetTokenDataset, PlanLoader  # noqa: E402

#: one damage: ("flip", where in the region as a fraction, which bit) or ("cut", where, _)
FLIP = st.tuples(st.just("flip"), st.floats(0, 1, exclude_max=True), st.integers(0, 7))
DAMAGE = st.one_of(FLIP, FLIP, st.tuples(st.just("cut"), st.floats(0, 1), st.just(0)))
READ = st.sampled_from(["pread", "mmap"])
FUZZ = settings(max_examples=30, deadline=None, derandomize=True, database=None)
#: samples of the corpus, and the long ones (several check values each) among them
SAMPLES, LONG = 1_500, (4_097, 5_000, 8_192, 9_001, 12_500)
SPLIT = 3_000  # the plan's pieces: not aligned with the 4096-token chunks


def tokenized(path: Path, seed: int, lens: np.ndarray, ids: np.ndarray) -> dict[int, np.ndarray]:
    """A tokenized shard (int32 tokens, row groups of 400); its tokens by id."""
    rng = np.random.default_rng(seed)
    offsets = np.r_[0, np.cumsum(lens)].astype(np.int64)
    values = rng.integers(0, 50_000, int(offsets[-1])).astype(np.int32)
    tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    pq.write_table(pa.table({"sample_id": ids, "input_ids": tokens}), path, row_group_size=400)
    return {int(i): values[offsets[k] : offsets[k + 1]] for k, i in enumerate(ids)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A copy with its index and a split plan of it; the undamaged files and batches."""
    root = tmp_path_factory.mktemp("silent")
    rng = np.random.default_rng(3)
    lens = rng.integers(1, 60, SAMPLES)
    lens[100 + rng.choice(500, len(LONG), replace=False)] = LONG  # not in the last 64 KiB
    lens[[10, 20]] = lens[30] = 7  # same-length samples to swap
    ids = rng.permutation(SAMPLES).astype(np.int64) * 3 + 1
    truth = tokenized(root / "tok.parquet", 0, lens, ids)
    copy = root / "tok.arrow"
    cli("lengths", root / "tok.parquet", root / "meta", "--arrow-copy", copy, "-q")
    cli("sort", root / "meta", root / "sorted", "-q")
    cli("plan", root / "sorted", root / "plan", "--dp", 1, "--max-tokens", SPLIT,
        "--oversize", "split", "--split-len", SPLIT, "-q")  # fmt: skip
    art = {"root": root, "copy": copy, "lens": lens, "ids": ids, "truth": truth}
    art["bytes"] = {p: p.read_bytes() for p in (copy, index_path(copy))}
    art["batches"] = batches(art, copy, "pread")
    return art


def batches(art: dict[str, Any], copy: Path, read: str, workers: int = 0) -> list[Any]:
    """Every micro-batch of the plan read from ``copy``: its tokens and sample lengths."""
    loader = PlanLoader(art["root"] / "plan", ParquetTokenDataset(copy, read=read), rank=0,
                        num_workers=workers)  # fmt: skip
    return [(b.input_ids.numpy().copy(), b.seq_lens.numpy().copy()) for b in loader]


def right_or_one_line(art: dict[str, Any], read: Callable[[], list[Any]]) -> str | None:
    """``read()`` gives exactly the undamaged batches (None), or raises one InputError line
    (returned)."""
    try:
        got = read()
    except InputError as exc:
        message = str(exc)
        assert message and "\n" not in message, repr(message)
        return message
    want = art["batches"]
    assert len(got) == len(want)
    for (a, la), (b, lb) in zip(got, want, strict=True):
        assert np.array_equal(a, b) and np.array_equal(la, lb), "a wrong token was read"
    return None


@contextmanager
def damaged(path: Path, data: bytes) -> Iterator[None]:
    """``path`` holding ``data`` for the duration, then what it held."""
    original = path.read_bytes()
    path.write_bytes(data)
    try:
        yield
    finally:
        path.write_bytes(original)


def hurt(data: bytes, lo: int, hi: int, damage: tuple[str, float, int]) -> bytes:
    """``data`` with one bit of ``[lo, hi)`` flipped, or cut short within it."""
    kind, where, bit = damage
    at = lo + int(where * (hi - lo))
    if kind == "cut":
        return data[:at]
    out = bytearray(data)
    out[at] ^= 1 << bit
    return bytes(out)


def regions(art: dict[str, Any]) -> dict[str, list[tuple[int, int]]]:
    """Byte ranges of each region of the index: ``[lo, hi)`` pieces (a record field is one
    piece per record, so a damage lands in that field of some record)."""
    raw = art["bytes"][index_path(art["copy"])][:HEADER]
    head, text = json.loads(raw[len(token_index.MAGIC) :]), len(raw.rstrip(b" "))
    rows, posts, chunks = head["rows"], -(-head["rows"] // BLOCK), head["chunks"]
    records = HEADER + 8 * rows
    fields = {
        name: [(records + r * RECORD.itemsize + off, records + r * RECORD.itemsize + off + 8)
               for r in range(rows)]
        for name, (_, off) in RECORD.fields.items()  # type: ignore[union-attr]
    }  # fmt: skip
    tables = records + RECORD.itemsize * rows
    batches = tables + 16 * posts + 8 * chunks
    return {
        "header": [(0, text)],  # the magic and the JSON
        "padding": [(text, HEADER)],
        "ids": [(HEADER, records)],
        **fields,
        "fence": [(tables, tables + 8 * posts)],
        "blocks": [(tables + 8 * posts, tables + 16 * posts)],
        "chunks": [(tables + 16 * posts, batches)],
        "batches": [(batches, batches + BATCH.itemsize * head["batches"])],
    }


def test_the_corpus_is_read_whole_and_right(corpus: dict[str, Any]) -> None:
    """The fixture is what the fuzzing needs: long samples with chunk values, read as
    pieces, every sample read, and the tokens are the source's."""
    copy = corpus["copy"]
    head = json.loads(corpus["bytes"][index_path(copy)][len(token_index.MAGIC) : HEADER])
    assert head["version"] == 3 and head["chunks"] == sum(-(-n // 4096) for n in LONG)
    assert head["batches"] == -(-SAMPLES // 400)  # one per row group of the source
    lens = np.concatenate([ln for _, ln in corpus["batches"]])
    assert int(lens.sum()) == int(corpus["lens"].sum()) and lens.max() == SPLIT
    ds = ParquetTokenDataset(copy)
    ids = corpus["ids"]
    flat, got = ds.get_flat(ids)
    assert np.array_equal(flat, np.concatenate([corpus["truth"][int(i)] for i in ids]))
    assert right_or_one_line(corpus, lambda: batches(corpus, copy, "mmap")) is None


REGIONS = ["header", "padding", "ids", "start", "length", "check", "fence", "blocks", "chunks",
           "batches"]  # fmt: skip


@pytest.mark.parametrize("region", REGIONS)
@FUZZ
@given(damage=DAMAGE, which=st.floats(0, 1, exclude_max=True), read=READ)
def test_damage_in_every_region_of_the_index(
    corpus: dict[str, Any], region: str, damage: Any, which: float, read: str
) -> None:
    idx = index_path(corpus["copy"])
    pieces = regions(corpus)[region]
    lo, hi = pieces[int(which * len(pieces))]
    with damaged(idx, hurt(corpus["bytes"][idx], lo, hi, damage)):
        right_or_one_line(corpus, lambda: batches(corpus, corpus["copy"], read))


@FUZZ
@given(damage=DAMAGE, read=READ)
def test_damage_anywhere_in_the_copy(corpus: dict[str, Any], damage: Any, read: str) -> None:
    copy = corpus["copy"]
    data = corpus["bytes"][copy]
    with damaged(copy, hurt(data, 0, len(data), damage)):
        right_or_one_line(corpus, lambda: batches(corpus, copy, read))


def _token_bytes(art: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, int]:
    """Byte offset and byte length of every row's tokens in the copy, and the token size."""
    start, length, dtype = token_positions(art["copy"], "input_ids")
    return start * dtype.itemsize, length * dtype.itemsize, dtype.itemsize


@FUZZ
@given(where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7), read=READ)
def test_a_flipped_token_is_refused(
    corpus: dict[str, Any], where: float, bit: int, read: str
) -> None:
    """Damage aimed at the tokens (most of a random flip's targets are there anyway): the
    plan reads every sample, so it is always seen, and named."""
    copy = corpus["copy"]
    at, size, _ = _token_bytes(corpus)
    data = corpus["bytes"][copy]
    lo, hi = int(at.min()), int((at + size).max())
    tail = len(data) - token_index.TAIL  # damage there is refused at open, by the copy's digest
    with damaged(copy, hurt(data, lo, min(hi, tail), ("flip", where, bit))):
        message = right_or_one_line(corpus, lambda: batches(corpus, copy, read))
    assert message is not None and "do not match its check value" in message


def _swapped(art: dict[str, Any], rows: tuple[int, int]) -> bytes:
    at, size, _ = _token_bytes(art)
    (a, b), data = rows, bytearray(art["bytes"][art["copy"]])
    assert size[a] == size[b]
    first, second = data[at[a] : at[a] + size[a]], data[at[b] : at[b] + size[b]]
    data[at[a] : at[a] + size[a]], data[at[b] : at[b] + size[b]] = second, first
    return bytes(data)


@pytest.mark.parametrize("read", ["pread", "mmap"])
def test_a_stale_copy_of_the_same_size_is_refused(corpus: dict[str, Any], read: str) -> None:
    """Two samples of the same length swapped: the copy keeps its size and its last 64 KiB,
    so it opens; the swapped samples are refused by id, the others read right."""
    copy = corpus["copy"]
    rows = (10, 20)
    ids = corpus["ids"]
    with damaged(copy, _swapped(corpus, rows)):
        ds = ParquetTokenDataset(copy, read=read)
        others = np.delete(ids, rows)
        flat, _ = ds.get_flat(others)
        assert np.array_equal(flat, np.concatenate([corpus["truth"][int(i)] for i in others]))
        for row in rows:
            with pytest.raises(InputError, match=f"sample id {ids[row]} do not match"):
                ds.get_flat(np.array([ids[0], ids[row]]))
        right_or_one_line(corpus, lambda: batches(corpus, copy, read))


def test_another_dataset_of_the_same_size_is_refused(
    corpus: dict[str, Any], tmp_path: Path
) -> None:
    """A copy of other tokens with the same ids and lengths: the same size. Beside the index,
    it is refused at open where its last 64 KiB differ, else sample by sample."""
    root, copy = corpus["root"], corpus["copy"]
    truth = tokenized(tmp_path / "other.parquet", 9, corpus["lens"], corpus["ids"])
    other = tmp_path / "other.arrow"
    cli("lengths", tmp_path / "other.parquet", tmp_path / "meta", "--arrow-copy", other, "-q")
    assert other.stat().st_size == copy.stat().st_size
    with damaged(copy, other.read_bytes()):
        message = right_or_one_line(corpus, lambda: batches(corpus, copy, "pread"))
    assert message is not None and "does not belong to" in message
    # the other tokens up to the copy's last 64 KiB: the size and the tail are the copy's
    at, size, _ = _token_bytes(corpus)
    data = bytearray(corpus["bytes"][copy])
    early = np.flatnonzero(at + size < len(data) - token_index.TAIL)
    mixed = other.read_bytes()
    for r in early.tolist():
        data[at[r] : at[r] + size[r]] = mixed[at[r] : at[r] + size[r]]
    assert any(not np.array_equal(truth[int(i)], corpus["truth"][int(i)]) for i in corpus["ids"])
    with damaged(copy, bytes(data)):
        message = right_or_one_line(corpus, lambda: batches(corpus, copy, "mmap"))
    assert message is not None and "do not match its check value" in message
    assert str(root / "plan") not in message


def _columns_at(data: bytes, batch: int) -> tuple[int, int]:
    """Byte offsets in the copy ``data`` of record batch ``batch``'s sample ids and token
    offsets (int64 each)."""
    buf = pa.py_buffer(data)
    got = pa.ipc.open_file(buf).get_batch(batch)
    ids, offsets = got.column("sample_id").buffers()[1], got.column("input_ids").buffers()[1]
    return ids.address - buf.address, offsets.address - buf.address


def _rewritten(art: dict[str, Any], how: str) -> tuple[bytes, list[int]]:
    """The copy with its sample ids or sample bounds rewritten (its tokens where they were),
    and the rows whose samples changed. Batches hold 400 rows (the source's row groups)."""
    data = bytearray(art["bytes"][art["copy"]])
    ids = np.frombuffer(data, "<i8", len(data) // 8)  # a view: writes go to data
    if how in ("ids in one batch", "ids of two batches"):
        rows = [5, 50] if how == "ids in one batch" else [5, 805]
        at = [_columns_at(bytes(data), r // 400)[0] // 8 + r % 400 for r in rows]
        ids[at[0]], ids[at[1]] = ids[at[1]], ids[at[0]]
        return bytes(data), rows
    r = next(r for r in range(401, 798) if art["lens"][r + 1] >= 2)  # batch 1
    ids[_columns_at(bytes(data), 1)[1] // 8 + (r + 1) % 400] += 1  # its first token: the row before
    return bytes(data), [r, r + 1]


@contextmanager
def in_place(path: Path, data: bytes) -> Iterator[None]:
    """``path`` rewritten in place with ``data`` (the same size), its inode and modification
    time kept, for the duration."""
    before, original = path.stat(), path.read_bytes()
    assert len(data) == len(original)
    with path.open("r+b") as f:
        f.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    now = path.stat()
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns)  # fmt: skip
    try:
        yield
    finally:
        path.write_bytes(original)


@pytest.mark.parametrize("how", ["ids in one batch", "ids of two batches", "sample bounds"])
@pytest.mark.parametrize("read", ["pread", "mmap"])
def test_a_copy_rewritten_in_place_under_its_index_is_refused(
    corpus: dict[str, Any], how: str, read: str
) -> None:
    """The copy's own sample ids or token offsets rewritten after indexing, its tokens where
    they were (so every check value still holds), of the same size and modification time:
    the index's positions are stale for the rows that changed. Reading one of them is one
    line naming the copy and the command that indexes it again; the batches left as they were
    still read right."""
    copy, ids, truth = corpus["copy"], corpus["ids"], corpus["truth"]
    data, rows = _rewritten(corpus, how)
    with in_place(copy, data):
        new = pa.ipc.open_file(pa.py_buffer(data)).read_all()
        now = dict(zip(new.column("sample_id").to_pylist(), new.column("input_ids").to_pylist(),
                       strict=True))  # fmt: skip
        assert any(now[int(ids[r])] != truth[int(ids[r])].tolist() for r in rows)  # changed
        ds = ParquetTokenDataset(copy, read=read)
        for r in rows:
            with pytest.raises(InputError) as caught:
                ds.get_flat(np.array([ids[r]]))
            line = str(caught.value)
            assert "\n" not in line and line.startswith(f"{copy}: its sample ids")
            assert f"varpack lengths ... --arrow-copy {copy} --overwrite" in line
        kept = ids[1200:1300]  # batch 3: as it was
        flat, _ = ParquetTokenDataset(copy, read=read).get_flat(kept)
        assert np.array_equal(flat, np.concatenate([truth[int(i)] for i in kept]))
        message = right_or_one_line(corpus, lambda: batches(corpus, copy, read))
    assert message is not None and "(the copy was rewritten since)" in message


def _version_two(art: dict[str, Any]) -> bytes:
    """The index as varpack wrote it before the record batches' digests (version 2)."""
    raw = art["bytes"][index_path(art["copy"])]
    head = json.loads(raw[len(token_index.MAGIC) : HEADER])
    body = raw[HEADER : len(raw) - BATCH.itemsize * head.pop("batches")]
    old = {k: v for k, v in head.items() if k != "checksum"} | {"version": 2}
    rows, posts = head["rows"], -(-head["rows"] // BLOCK)
    at = HEADER + (8 + RECORD.itemsize) * rows
    fence = np.frombuffer(raw, "<i8", posts, at)
    blocks = np.frombuffer(raw, "<u8", posts, at + 8 * posts)
    old["checksum"] = token_index._checksum(old, fence, blocks)
    return (token_index.MAGIC + json.dumps(old).encode()).ljust(HEADER, b" ") + body


def test_an_index_of_version_two_is_refused_with_the_command_that_rewrites_it(
    corpus: dict[str, Any],
) -> None:
    copy = corpus["copy"]
    with damaged(index_path(copy), _version_two(corpus)):
        with pytest.raises(InputError) as caught:
            ParquetTokenDataset(copy)
    message = str(caught.value)
    assert "version 2, which cannot tell" in message and "\n" not in message
    assert f"varpack lengths ... --arrow-copy {copy} --overwrite" in message


def test_an_index_beside_the_wrong_copy_is_refused(corpus: dict[str, Any], tmp_path: Path) -> None:
    lens = corpus["lens"].copy()
    lens[0] += 1  # another size
    tokenized(tmp_path / "t.parquet", 1, lens, corpus["ids"])
    cli("lengths", tmp_path / "t.parquet", tmp_path / "meta", "--arrow-copy",
        tmp_path / "t.arrow", "-q")  # fmt: skip
    shutil.copy(index_path(corpus["copy"]), index_path(tmp_path / "t.arrow"))
    with pytest.raises(InputError, match=r"t.arrow.idx does not belong to .*t.arrow"):
        ParquetTokenDataset(tmp_path / "t.arrow")


def _version_one(art: dict[str, Any]) -> bytes:
    """The index as varpack wrote it before check values (version 1)."""
    copy = art["copy"]
    new = art["bytes"][index_path(copy)]
    head = json.loads(new[len(token_index.MAGIC) : HEADER])
    rows = head["rows"]
    ids = np.frombuffer(new, "<i8", rows, HEADER)
    records = np.frombuffer(new, RECORD, rows, HEADER + 8 * rows)
    old = {k: head[k] for k in ("rows", "token_type", "size", "tail_sha256")} | {"version": 1}
    text = (token_index.MAGIC + json.dumps(old).encode()).ljust(HEADER, b" ")
    parts = (ids, records["start"], records["length"], ids[::BLOCK])
    return text + b"".join(np.ascontiguousarray(p, dtype="<i8").tobytes() for p in parts)


def test_an_index_of_version_one_is_refused_with_the_command_that_rewrites_it(
    corpus: dict[str, Any],
) -> None:
    copy = corpus["copy"]
    with damaged(index_path(copy), _version_one(corpus)):
        with pytest.raises(InputError) as caught:
            ParquetTokenDataset(copy)
    message = str(caught.value)
    assert "version 1, without check values" in message and "\n" not in message
    assert f"varpack lengths ... --arrow-copy {copy} --overwrite" in message


def test_a_damaged_worker_read_is_one_line(corpus: dict[str, Any]) -> None:
    """A DataLoader worker verifies what it reads: its refusal is the loader's one line."""
    copy = corpus["copy"]
    with damaged(copy, _swapped(corpus, (10, 30))):
        message = right_or_one_line(corpus, lambda: batches(corpus, copy, "pread", workers=1))
    assert message is not None and "do not match its check value" in message


def test_a_piece_reads_only_the_chunks_it_overlaps(corpus: dict[str, Any]) -> None:
    """A long sample damaged in its last chunk: its first piece still reads right (only its
    own chunks are read and verified), the piece over the damage is refused."""
    copy = corpus["copy"]
    at, size, item = _token_bytes(corpus)
    row = int(np.flatnonzero(corpus["lens"] == 12_500)[0])
    sid = int(corpus["ids"][row])
    data = bytearray(corpus["bytes"][copy])
    data[int(at[row] + size[row]) - item] ^= 1  # the last token
    with damaged(copy, bytes(data)):
        ds = ParquetTokenDataset(copy)
        piece, _ = ds.get_flat(np.array([sid]), np.array([0]), np.array([SPLIT]), split_len=SPLIT)
        assert np.array_equal(piece, corpus["truth"][sid][:SPLIT])
        with pytest.raises(InputError, match=f"sample id {sid} do not match"):
            ds.get_flat(np.array([sid]), np.array([12_000]), np.array([500]), split_len=SPLIT)
        with pytest.raises(InputError, match=f"sample id {sid} do not match"):
            ds.get_flat(np.array([sid]))


def _shards(root: Path, truth: dict[int, np.ndarray]) -> Path:
    """Three copies of disjoint id ranges in one directory, opened as one."""
    copies = root / "copies"
    copies.mkdir()
    for k in range(3):
        ids = np.arange(k * 1000, k * 1000 + 300, dtype=np.int64)
        lens = np.random.default_rng(k).integers(1, 30, 300)
        truth |= tokenized(root / f"s{k}.parquet", 20 + k, lens, ids)
        cli("lengths", root / f"s{k}.parquet", root / f"meta{k}", "--arrow-copy",
            copies / f"s{k}.arrow", "-q")  # fmt: skip
    return copies


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("shards")
    truth: dict[int, np.ndarray] = {}
    copies = _shards(root, truth)
    ids = np.array(sorted(truth), dtype=np.int64)
    ds = ParquetTokenDataset(copies)
    assert ds._index is not None and len(ds) == 900
    return {"copies": copies, "truth": truth, "ids": ids,
            "want": np.concatenate([truth[int(i)] for i in ids])}  # fmt: skip


@FUZZ
@given(damage=DAMAGE, which=st.integers(0, 5), read=READ)
def test_damage_to_one_of_several_copies(
    shards: dict[str, Any], damage: Any, which: int, read: str
) -> None:
    """Copies of several shards opened as one: damage to any one copy or index is refused,
    naming that copy, or reads right."""
    path = sorted(shards["copies"].iterdir())[which]
    data = path.read_bytes()
    with damaged(path, hurt(data, 0, len(data), damage)):
        try:
            flat, _ = ParquetTokenDataset(shards["copies"], read=read).get_flat(shards["ids"])
        except InputError as exc:
            assert "\n" not in str(exc) and path.name.removesuffix(".idx") in str(exc)
            return
    assert np.array_equal(flat, shards["want"]), "a wrong token was read"


def test_the_check_value_binds_id_length_and_every_token() -> None:
    """Any one token changed, the id or the length changed: another check value."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 1 << 31, 64).astype(np.int32)

    def value(t: np.ndarray, sid: int = 5) -> int:
        check, _ = token_check.sample_values(t, np.array([0]), np.array([len(t)]),
                                             np.array([sid]))  # fmt: skip
        return int(check[0])

    base = value(tokens)
    assert value(tokens, sid=6) != base and value(tokens[:-1]) != base
    for k in range(len(tokens)):
        for bit in (0, 17, 31):
            t = tokens.copy()
            t[k] ^= np.int32(1 << bit) if bit < 31 else np.int32(-(1 << 31))
            assert value(t) != base, (k, bit)


def test_the_writer_and_the_copy_give_the_same_index(
    corpus: dict[str, Any], tmp_path: Path
) -> None:
    """``lengths --arrow-copy`` hashes the tokens as it writes them; the index built from the
    copy's own bytes afterwards is byte for byte the same (long samples' chunks included)."""
    again = tmp_path / "again.idx"
    token_index.write_index(corpus["copy"], again)
    assert again.read_bytes() == corpus["bytes"][index_path(corpus["copy"])]
