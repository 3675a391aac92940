"""The trainer and the reader explain themselves: vocabulary, resume, token counts, columns, steps.

jobs/train.py runs here as one plain process (no torchrun: world size 1, a dp=1 plan), so each
case takes a few seconds; the two-rank DDP run is in test_torch_distributed.py.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch.nn")

from plan_helpers import make_plan, random_lengths, ranks, write_tokens  # noqa: E402
from testkit import cli, load_train, write_metadata  # noqa: E402
from warm_start import warm_start  # noqa: E402

from varpack.errors import InputError  # noqa: E402
from varpack.torch import ParquetTokenDataset, PlanLoader, check_vocab  # noqa: E402
from varpack.torch.vocab import token_range  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "jobs" / "train.py"


@pytest.fixture
def here(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``here(*args)``: train.py's ``main`` as one process's run, in this process (its imports
    paid once, not once per run); what it printed to stdout. A run that must fail goes through
    ``train`` below: its own process, whose stderr is checked to be one line."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    def run(*args: object) -> str:
        capsys.readouterr()
        code = _trainer().main([str(a) for a in args])
        said = capsys.readouterr()
        assert code == 0, said.err
        return said.out

    return run


def _trainer() -> Any:
    return load_train("varpack_jobs_train_explain")


def train(*args: object, expect: int = 0) -> subprocess.CompletedProcess[str]:
    """``python jobs/train.py ARGS``, forked from a process that imported it already (its
    imports are seconds of CPU a process; ``warm_start``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with warm_start(TRAIN, env).start(TRAIN, [str(a) for a in args], env, ROOT) as proc:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == expect, f"rc={proc.returncode}\n{out}\n{err[-3000:]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A dp=1 plan of 40 samples (planned by the CLI) and their tokens (ids below 256)."""
    tmp = tmp_path_factory.mktemp("job")
    lens = random_lengths(np.random.default_rng(3), 40, 2, 30)
    write_tokens(tmp / "tok.parquet", list(lens), list(lens.values()), vocab=256)
    write_metadata(tmp / "meta" / "m.parquet", list(lens), list(lens.values()))
    cli("plan", tmp / "meta", tmp / "plan", "--max-tokens", 64, "--grad-accum", 2, "-q")
    return tmp, lens


def _error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("varpack: error: ")
    return lines[0]


@pytest.mark.slow
def test_train_checks_the_vocabulary_before_training(job) -> None:
    tmp, _ = job
    base = ["--plan", tmp / "plan", "--data", tmp / "tok.parquet", "--out", tmp / "vocab"]
    line = _error_line(train(*base, "--vocab-size", 100, expect=2))
    assert re.search(r"token id \d+ \(sample id \d+\) but the model's vocabulary has 100", line)
    assert "raise --vocab-size" in line
    assert not (tmp / "vocab" / "checkpoint.pt").exists()  # failed before training


@pytest.mark.slow
def test_train_resume_logs_and_final_line(job, here) -> None:
    tmp, lens = job
    base = ["--plan", tmp / "plan", "--data", tmp / "tok.parquet", "--out", tmp / "run"]
    line = _error_line(train(*base, "--resume", expect=2))
    assert "--resume: no checkpoint" in line and "checkpoint.pt" in line
    first = here(*base, "--max-steps", 2)
    assert "resumed" not in first
    rest = here(*base, "--resume")
    num_steps = PlanLoader(tmp / "plan", ParquetTokenDataset(tmp / "tok.parquet")).num_steps
    assert (f"resumed after step 2 (2 of the plan's {num_steps} steps done in epoch 0, "
            f"{num_steps - 2} steps left in this pass)") in rest  # fmt: skip
    done = rest.strip().splitlines()[-1]
    # The resumed half: its own steps, named in the run's count; global tokens (all ranks) and
    # per-rank tokens, each said to be what it is, all of this half.
    m = re.search(r"done: (\d+) steps \(steps 3 to (\d+) of the run\) in .*; ([\d,]+) tokens in "
                  r"all \(global: every rank, .*\), ([\d,]+) per rank \(1 rank\)", done)  # fmt: skip
    assert m and int(m.group(1)) == num_steps - 2 and int(m.group(2)) == num_steps, done
    whole = here("--plan", tmp / "plan", "--data", tmp / "tok.parquet", "--out", tmp / "whole")
    m_all = re.search(r"; ([\d,]+) tokens in all", whole)
    assert m_all and int(m_all.group(1).replace(",", "")) == sum(lens.values())
    assert int(m.group(3).replace(",", "")) == int(m.group(4).replace(",", "")) < sum(lens.values())


def test_check_vocab_names_the_largest_id_and_its_sample(tmp_path) -> None:
    lens = {10: 5, 11: 7, 12: 3}
    truth = write_tokens(tmp_path / "t.parquet", list(lens), list(lens.values()), vocab=50)
    plan = make_plan(tmp_path / "plan", lens, dp=1, grad_accum=1, budget=16)
    loader = PlanLoader(plan, ParquetTokenDataset(tmp_path / "t.parquet"))
    top = max(int(t.max()) for t in truth.values())
    holder = next(i for i, t in truth.items() if int(t.max()) == top)
    assert check_vocab(loader, top + 1) == top
    with pytest.raises(
        InputError, match=f"token id {top} \\(sample id {holder}\\).* has {top}"
    ) as err:
        check_vocab(loader, top)
    assert "raise the model's vocab_size to at least" in str(err.value)  # no CLI flag from Python
    # chunked: the same answer one sample at a time, each sample read once
    assert token_range(truth, np.array([12, 10, 11, 10]), np.array([3, 5, 7, 5]), 4) == (
        min(int(t.min()) for t in truth.values()),
        top,
        holder,
    )
    with pytest.raises(InputError, match="token id -3"):
        check_vocab(PlanLoader(plan, {10: np.array([-3]), 11: truth[11], 12: truth[12]}), 64)


def _hf_style(path: Path, id_name: str | None, tok_name: str) -> dict[int, list[int]]:
    data = {7: [1, 2, 3], 3: [4, 5], 9: [6]}
    cols: dict[str, object] = {tok_name: pa.array(list(data.values()), pa.list_(pa.int32()))}
    if id_name is not None:
        cols[id_name] = pa.array(list(data), pa.int64())
    cols["source"] = pa.array(["a", "b", "c"])
    pq.write_table(pa.table(cols), path)
    return data


@pytest.mark.parametrize(("id_name", "tok_name"), [("id", "input_ids"), ("sample_id", "tokens")])
def test_dataset_detects_hugging_face_style_columns(tmp_path, id_name, tok_name) -> None:
    data = _hf_style(tmp_path / "d.parquet", id_name, tok_name)
    ds = ParquetTokenDataset(tmp_path / "d.parquet")
    assert (ds.column, ds.id_column) == (tok_name, id_name)
    assert ds[7].tolist() == data[7] and ds[9].tolist() == data[9]


def test_dataset_without_known_columns_names_what_it_found(tmp_path) -> None:
    _hf_style(tmp_path / "noid.parquet", "uid", "input_ids")
    with pytest.raises(InputError, match=r"no id column \(looked for sample_id, id; columns: "
                       r"input_ids, uid, source\); pass id_column= \(--id-column"):  # fmt: skip
        ParquetTokenDataset(tmp_path / "noid.parquet")
    assert ParquetTokenDataset(tmp_path / "noid.parquet", id_column="uid")[3].tolist() == [4, 5]
    _hf_style(tmp_path / "notok.parquet", "id", "text_ids")
    with pytest.raises(InputError, match=r"no token column .*columns: text_ids, id, source\); "
                       r"pass column= \(--column"):  # fmt: skip
        ParquetTokenDataset(tmp_path / "notok.parquet")
    with pytest.raises(InputError, match=r"no column 'ids' .*; pass id_column="):
        ParquetTokenDataset(tmp_path / "notok.parquet", column="text_ids", id_column="ids")


def test_len_counts_micro_batches_and_steps_counts_what_is_left(tmp_path, rng) -> None:
    lens = random_lengths(rng, 60, 2, 30)
    write_tokens(tmp_path / "t.parquet", list(lens), list(lens.values()))
    plan = make_plan(tmp_path / "plan", lens, dp=2, grad_accum=3, budget=64, pad_multiple=8)
    loader = PlanLoader(plan, ParquetTokenDataset(tmp_path / "t.parquet"), rank=1)
    n = loader.num_steps
    assert len(loader) == n * loader.grad_accum and loader.steps == n
    it = iter(loader)
    for _ in range(2 * loader.grad_accum):  # two whole steps
        next(it)
    assert loader.steps == n - 2 and len(loader) == n * loader.grad_accum
    again = PlanLoader(plan, ParquetTokenDataset(tmp_path / "t.parquet"), rank=1)
    again.load_state_dict(loader.state_dict())
    assert again.steps == n - 2
    assert sum(b.is_last_micro for b in again) == n - 2
    assert again.steps == n  # the pass is over: the next one has every step


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 20), min_size=0, max_size=40),
    st.integers(1, 50),
    st.integers(0, 2**31),
)
def test_token_range_reads_every_sample_in_chunks(lens: list[int], chunk: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    data = {i: rng.integers(0, 10_000, n) for i, n in enumerate(lens)}
    reads: list[int] = []

    class Counting(dict):
        def __getitem__(self, key):
            reads.append(int(key))
            return super().__getitem__(key)

    order = rng.permutation(len(lens)).tolist() * 2  # every sample twice (two epochs)
    got = token_range(
        Counting(data), np.array(order, np.int64), np.array([lens[i] for i in order]), chunk
    )
    assert sorted(reads) == list(range(len(lens)))  # each distinct sample read once
    if not lens:
        assert got == (0, -1, None)
        return
    flat = np.concatenate(list(data.values()))
    assert got[:2] == (int(flat.min()), int(flat.max()))
    assert int(data[got[2]].max()) == got[1]


@pytest.mark.slow
def test_two_ranks_stop_together_when_one_rank_has_a_bad_token_id(tmp_path) -> None:
    """Only one rank's samples hold the bad id: both ranks stop, neither hangs, and the job says
    why in one line (rank 0 prints the failing rank's message)."""
    lens = {i: 8 for i in range(8)}
    truth = write_tokens(tmp_path / "tok.parquet", list(lens), list(lens.values()), vocab=200)
    truth[5][3] = 300  # beyond the tiny preset's 256 entries
    write_tokens_exact(tmp_path / "tok.parquet", truth)
    plan = make_plan(tmp_path / "plan", lens, dp=2, micros=[[0, 1], [5, 6], [2, 3], [4, 7]])
    proc = ranks(
        2, ROOT / "jobs" / "train.py", "--plan", plan, "--data", tmp_path / "tok.parquet",
        "--out", tmp_path / "run", check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    errors = [x for x in proc.stderr.splitlines() if x.startswith("varpack: error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "rank 1's samples hold token id 300 (sample id 5)" in errors[0]
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def write_tokens_exact(path: Path, data: dict[int, np.ndarray]) -> None:
    table = pa.table(
        {
            "sample_id": pa.array(list(data), pa.int64()),
            "input_ids": pa.array([v.tolist() for v in data.values()], pa.list_(pa.int32())),
        }
    )
    pq.write_table(table, path)


@pytest.mark.slow
def test_train_logs_the_loss_per_carried_value(tmp_path, here) -> None:
    """--log-by source: each source's mean token loss; weighted by its tokens they give the
    step's loss (the same token-mean), and a column the plan does not carry is one line."""
    lens = random_lengths(np.random.default_rng(5), 40, 2, 30)
    write_tokens(tmp_path / "tok.parquet", list(lens), list(lens.values()), vocab=256)
    source = ["web" if i % 3 else "code" for i in lens]
    write_metadata(tmp_path / "meta" / "m.parquet", list(lens), list(lens.values()), source=source)
    opts = ["--max-tokens", 64, "--grad-accum", 2, "-q"]
    cli("plan", tmp_path / "meta", tmp_path / "plan", *opts, "--carry", "source")
    base = ["--plan", tmp_path / "plan", "--data", tmp_path / "tok.parquet"]
    run = here(*base, "--out", tmp_path / "run", "--log-by", "source", "--max-steps", 3)
    steps = re.findall(r"step +(\d+)  loss (\d+\.\d+)  lr", run)
    by = re.findall(r"step +(\d+)  loss by source: (.*)", run)
    assert len(steps) == len(by) == 3
    for (step, loss), (step2, groups) in zip(steps, by, strict=True):
        assert step == step2
        parts = re.findall(r"(\w+) (\d+\.\d+) \(([\d,]+) tok\)", groups)
        assert {p[0] for p in parts} <= {"web", "code"} and parts
        tok = np.array([int(p[2].replace(",", "")) for p in parts])
        mean = np.array([float(p[1]) for p in parts])
        assert float((mean * tok).sum() / tok.sum()) == pytest.approx(float(loss), abs=2e-4)
    cli("plan", tmp_path / "meta", tmp_path / "bare", *opts)
    bare = ["--plan", tmp_path / "bare", "--data", tmp_path / "tok.parquet"]
    line = _error_line(train(*bare, "--out", tmp_path / "x", "--log-by", "source", expect=2))
    assert "--log-by source: the plan carries no such column (carried: none)" in line


@pytest.mark.slow
def test_two_ranks_log_the_loss_per_carried_value_over_both(tmp_path) -> None:
    """Each rank sees its own sources; the logged groups are merged over both ranks, and
    weighted by their tokens they give the step's (all-reduced) loss."""
    lens = random_lengths(np.random.default_rng(6), 60, 2, 30)
    write_tokens(tmp_path / "tok.parquet", list(lens), list(lens.values()), vocab=256)
    source = [f"s{i % 4}" for i in lens]
    write_metadata(tmp_path / "meta" / "m.parquet", list(lens), list(lens.values()), source=source)
    cli("plan", tmp_path / "meta", tmp_path / "plan", "--max-tokens", 64, "--dp", 2,
        "--carry", "source", "-q")  # fmt: skip
    proc = ranks(
        2, ROOT / "jobs" / "train.py", "--plan", tmp_path / "plan", "--data",
        tmp_path / "tok.parquet", "--out", tmp_path / "run", "--log-by", "source",
        "--max-steps", 2,
    )  # fmt: skip
    steps = dict(re.findall(r"step +(\d+)  loss (\d+\.\d+)  lr", proc.stdout))
    by = re.findall(r"step +(\d+)  loss by source: (.*)", proc.stdout)
    assert len(by) == 2 and set(steps) == {s for s, _ in by}
    for step, groups in by:
        parts = re.findall(r"(\w+) (\d+\.\d+) \(([\d,]+) tok\)", groups)
        tok = np.array([int(p[2].replace(",", "")) for p in parts])
        mean = np.array([float(p[1]) for p in parts])
        assert float((mean * tok).sum() / tok.sum()) == pytest.approx(float(steps[step]), abs=2e-4)
