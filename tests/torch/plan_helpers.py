"""Test helpers for the torch reader: tokenized Parquet and small hand-made plans.

Plans are written with :func:`varpack.planfile.write_plan` from micro-batches chosen here, so the
reader's tests do not depend on the planner; the example trainer's test uses ``varpack plan``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from warm_start import warm_start

from varpack.planfile.format import write_plan


def write_tokens(
    path: Path,
    ids: Sequence[int] | np.ndarray,
    lens: Sequence[int] | np.ndarray,
    vocab: int = 256,
    seed: int = 0,
    row_group_size: int | None = None,
) -> dict[int, np.ndarray]:
    """A tokenized Parquet file (sample_id int64, input_ids list<int32>); returns id -> tokens."""
    rng = np.random.default_rng(seed)
    lens = np.asarray(lens, dtype=np.int64)
    values = rng.integers(1, vocab, int(lens.sum())).astype(np.int32)
    offsets = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"sample_id": pa.array(np.asarray(ids, dtype=np.int64)), "input_ids": tokens})
    pq.write_table(table, path, row_group_size=row_group_size)
    return {int(i): values[offsets[k] : offsets[k + 1]] for k, i in enumerate(ids)}


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def greedy_micro_batches(
    ids: Sequence[int], lens: dict[int, int], budget: int, layout: str
) -> list[list[int]]:
    """Samples in order, as many per micro-batch as fit the budget (tokens or B x longest)."""
    out: list[list[int]] = [[]]
    for i in ids:
        cur = out[-1] + [i]
        cost = (
            sum(lens[j] for j in cur)
            if layout == "packed"
            else len(cur) * max(lens[j] for j in cur)
        )
        if out[-1] and cost > budget:
            out.append([i])
        else:
            out[-1] = cur
    return out


def split_to_multiple(
    micros: list[list[int]], lens: dict[int, int], multiple: int
) -> list[list[int]]:
    """Split the largest micro-batches in two until their count is a multiple (ROLL's rule)."""
    micros = [list(m) for m in micros]
    while len(micros) % multiple:
        k = max(
            (j for j in range(len(micros)) if len(micros[j]) > 1),
            key=lambda j: sum(lens[i] for i in micros[j]),
        )
        m = micros[k]
        micros[k : k + 1] = [m[: len(m) // 2], m[len(m) // 2 :]]
    return micros


def make_plan(
    out: Path,
    lens: dict[int, int],
    dp: int = 1,
    grad_accum: int = 1,
    layout: str = "packed",
    budget: int = 64,
    pad_multiple: int = 1,
    order: Sequence[int] | None = None,
    base_batch: int = 4,
    micros: list[list[int]] | None = None,
    blocks: list[list[list[int]]] | None = None,
    block_len: int | None = None,
    pad_rows: Sequence[int] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a plan: micro-batch j of the stream goes to step j // (dp*K), rank (j // K) % dp."""
    if blocks is not None:
        micros = [[i for blk in mb for i in blk] for mb in blocks]
    elif micros is None:
        micros = greedy_micro_batches(
            list(order if order is not None else lens), lens, budget, layout
        )
        micros = split_to_multiple(micros, lens, dp * grad_accum)
    per_step = dp * grad_accum
    assert len(micros) % per_step == 0, "micro-batches must fill whole steps"
    num_steps = len(micros) // per_step
    rows: list[list[dict[str, Any]]] = [[] for _ in range(dp)]
    for j, mb in enumerate(micros):
        step, rank, micro = j // per_step, (j // grad_accum) % dp, j % grad_accum
        step_ids = [i for m in micros[step * per_step : (step + 1) * per_step] for i in m]
        seq = [lens[i] for i in mb]
        if blocks is not None:
            assert block_len is not None
            pad_to = block_len
        elif layout == "packed":
            pad_to = _round_up(sum(seq), pad_multiple) if seq else 0
        else:
            pad_to = _round_up(max(seq), pad_multiple) if seq else 0
        row: dict[str, Any] = {
            "step": step,
            "micro": micro,
            "sample_ids": list(mb),
            "seq_lens": seq,
            "pad_to": pad_to,
            "lr_factor": len(step_ids) / base_batch,
            "step_tokens": sum(lens[i] for i in step_ids),
            "step_samples": len(step_ids),
            "warmup": False,
        }
        if blocks is not None:
            row["block_index"] = [b for b, blk in enumerate(blocks[j]) for _ in blk]
        if pad_rows is not None:
            row["pad_rows"] = pad_rows[j]
        rows[rank].append(row)
    tables = [pa.Table.from_pylist(r) for r in rows]
    config = {"layout": "packed" if blocks is not None else layout}
    if blocks is not None:
        config["batching"] = "blocks"
    meta = {
        "config": config,
        "input": {
            "num_samples": len(lens),
            "total_tokens": int(sum(lens.values())),
            "fingerprint": "test",
        },
        "layout": {"dp": dp, "pp": 1, "cp": 1, "grad_accum": grad_accum},
        "num_steps": num_steps,
        "stats": {},
        "dropped": {"ids": [], "reasons": []},
    }
    return write_plan(out, meta, tables, overwrite=overwrite)


def random_lengths(rng: np.random.Generator, n: int, lo: int = 2, hi: int = 40) -> dict[int, int]:
    """n samples with shuffled, non-contiguous ids and lengths in [lo, hi]."""
    ids = rng.permutation(n * 3)[:n] + 1000
    return {int(i): int(x) for i, x in zip(ids, rng.integers(lo, hi + 1, n), strict=True)}


ROOT = Path(__file__).resolve().parents[2]


def torchrun(
    nproc: int, script: Path, *args: object, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node N script args`` from the repository root, on
    the CPU (one thread per process, PYTHONPATH to this checkout). It runs in a session of its
    own, so a timeout kills every rank, not only the launcher (no stray ranks left behind)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(script), *map(str, args)]  # fmt: skip
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        start_new_session=True,
    ) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check:
        assert done.returncode == 0, f"rc={done.returncode}\nstdout:\n{out}\nstderr:\n{err[-4000:]}"
    return done


def ranks(
    nproc: int, script: Path, *args: object, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``script args`` in ``nproc`` processes, each with what torchrun gives a worker (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous store, served here on a port the OS picks),
    without torchrun's launcher: a Python process that imports torch, 2 s of CPU a run. For tests
    of the trainer rather than of torchrun (``torchrun`` above). As under torchrun, a failing rank
    stops the others (after 30 s for them to agree on the error and exit); the outputs are the
    ranks' in rank order; the exit code is the lowest failing rank's."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore(
        "127.0.0.1", 0, nproc, True, timedelta(seconds=timeout), wait_for_workers=False
    )
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store.port), TORCHELASTIC_USE_AGENT_STORE="True", WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )  # fmt: skip
    cmd = [sys.executable, str(script), *map(str, args)]
    with tempfile.TemporaryDirectory() as logs:
        outs = [(Path(logs) / f"{r}.out", Path(logs) / f"{r}.err") for r in range(nproc)]
        server = warm_start(script, env)
        procs = [server.start(script, [str(a) for a in args], dict(env, RANK=str(r),
                              LOCAL_RANK=str(r)), ROOT, out, err) for r, (out, err) in enumerate(outs)]  # fmt: skip
        end, timed_out = time.monotonic() + timeout, False
        while any(p.poll() is None for p in procs):
            if any(p.returncode for p in procs):  # a rank failed: the others get 30 s to follow
                end = min(end, time.monotonic() + 30)
            if time.monotonic() > end:
                timed_out = not any(p.returncode for p in procs)
                for p in procs:
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
                break
            time.sleep(0.05)
        stdout = "".join(out.read_text() for out, _ in outs)
        stderr = "".join(err.read_text() for _, err in outs)
    del store
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr)
    code = next((p.returncode for p in procs if p.returncode), 0)
    if check:
        assert code == 0, f"rc={code}\nstdout:\n{stdout}\nstderr:\n{stderr[-4000:]}"
    return subprocess.CompletedProcess(cmd, code, stdout, stderr)
