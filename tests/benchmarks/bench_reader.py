"""Reader benchmark: collate throughput per worker and reader overhead against a model step (CPU).

    python tests/benchmarks/bench_reader.py [--quick]

Data: ``varpack synth --tokenized`` long-tail lengths (capped), ``varpack lengths``, then
``varpack plan`` (curriculum order, packed and padded, pad multiple 64). Rows, in one process:

- collate only: tokens already in memory (flat arrays), the cost of building the batch;
- Parquet: fetch from the tokenized Parquet through ``ParquetTokenDataset`` (row-group LRU);
- Arrow IPC: the same data copied once to an uncompressed Arrow file, read by ``pread`` (the
  default) and memory-mapped (``read="mmap"``);
- DataLoader, 2 workers (end-to-end; this machine has 2 cores);
- overhead: synchronous fetch+collate time of a micro-batch / a training micro-step (forward and
  backward) of the example model on the same micro-batch, both medians.

Targets: >= 50 M tokens/s per worker packed, overhead <= 2%.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from varpack.torch import ParquetTokenDataset, PlanLoader, normalise, token_loss_sum
from varpack.torch.dataset import segment_gather_index, write_arrow_tokens
from varpack.torch.loader import MicroBatches
from varpack.torch.model import PRESETS, TinyGPT, model_inputs


class InMemoryTokens:
    """All tokens in RAM as flat values + offsets (the collate-only baseline)."""

    def __init__(self, ds: ParquetTokenDataset) -> None:
        ids = ds._sorted_ids
        flat, lens = ds.get_flat(ids)
        self.ids, self.values = ids, flat
        self.offsets = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=self.offsets[1:])

    def get_flat(self, sample_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.searchsorted(self.ids, sample_ids)
        starts, lens = self.offsets[pos], self.offsets[pos + 1] - self.offsets[pos]
        return self.values[segment_gather_index(starts, lens)], lens


def vp(*args: object) -> None:
    subprocess.run([sys.executable, "-m", "varpack", *map(str, args), "-q"], check=True)


def rate(items: MicroBatches, rounds: int, max_rows: int | None = None) -> tuple[float, float]:
    """(median tokens/s over rounds, median seconds per micro-batch) of fetch + collate.

    Rows in plan order, all of them or the first ``max_rows`` (the slow Parquet rows).
    """
    n = len(items) if max_rows is None else min(max_rows, len(items))
    tokens = int(items.rows.lens[: items.rows.lens_off[n]].sum())
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for i in range(n):
            items[(0, i)].to_batch()
        times.append(time.perf_counter() - t)
    best = statistics.median(times)
    return tokens / best, best / n


def loader_rate(plan: Path, ds: object, workers: int) -> float:
    loader = PlanLoader(
        plan, ds, rank=0, num_workers=workers, prefetch_factor=4 if workers else None
    )
    tokens, t = 0, time.perf_counter()
    for b in loader:
        tokens += b.num_tokens
    return tokens / (time.perf_counter() - t)


def model_step_time(plan: Path, ds: object, preset: str, reps: int) -> tuple[float, float, int]:
    """Median (fetch+collate s, train micro-step s, tokens) over the plan's largest micro-batches."""
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = TinyGPT(PRESETS[preset])
    loader = PlanLoader(plan, ds, rank=0)
    rows = loader.rows
    biggest = np.argsort(-rows.pad_to, kind="stable")[:reps]
    collate_t, step_t = [], []
    for i in biggest:
        t = time.perf_counter()
        batch = loader.dataset.batch(int(i))
        collate_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        loss = normalise(token_loss_sum(model(**model_inputs(batch)), batch.labels), batch, 1)
        loss.backward()
        step_t.append(time.perf_counter() - t)
    return statistics.median(collate_t), statistics.median(step_t[1:]), int(rows.pad_to[biggest[0]])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 20_000 if args.quick else 200_000
    rounds = 3 if args.quick else 5
    with tempfile.TemporaryDirectory(prefix="bench-reader-") as tmp:
        root = Path(tmp)
        vp(
            "synth",
            root / "tok",
            "--tokenized",
            "-n",
            n,
            "--shards",
            4,
            "--max-len",
            8192,
            "--row-group-size",
            1024,
            "--vocab-size",
            256,
        )
        vp("lengths", root / "tok", root / "meta", "--id-column", "sample_id")
        for layout, budget in (("packed", 16384), ("padded", 16384)):
            vp(
                "plan",
                root / "meta",
                root / f"plan-{layout}",
                "--max-tokens",
                budget,
                "--layout",
                layout,
                "--pad-multiple",
                64,
            )
        vp(
            "plan",
            root / "meta",
            root / "plan-model",
            "--max-tokens",
            2048,
            "--pad-multiple",
            64,
            "--oversize",
            "drop",
        )
        pq_ds = ParquetTokenDataset(root / "tok", cache_row_groups=16)
        t = time.perf_counter()
        arrow = write_arrow_tokens(root / "tok", root / "tok.arrow")
        convert_s = time.perf_counter() - t
        ipc_ds = ParquetTokenDataset(arrow)
        mmap_ds = ParquetTokenDataset(arrow, read="mmap")
        mem_ds = InMemoryTokens(ipc_ds)
        total = int(mem_ds.offsets[-1])
        print(
            f"data: {n:,} samples, {total:,} tokens (long-tail, max 8192); Arrow IPC copy {convert_s:.1f}s"
        )
        print(f"{'source':<22}{'layout':<8}{'M tokens/s/worker':>18}{'us/micro-batch':>16}")
        for name, ds in (
            ("collate only (RAM)", mem_ds),
            ("Arrow IPC (pread)", ipc_ds),
            ("Arrow IPC (mmap)", mmap_ds),
            ("Parquet (LRU 16 rg)", pq_ds),
        ):
            for layout in ("packed", "padded"):
                loader = PlanLoader(root / f"plan-{layout}", ds, rank=0)
                slow = name.startswith("Parquet")  # ~0.5 M tokens/s: a sample of rows is enough
                tps, per = rate(loader.dataset, 1 if slow else rounds, 100 if slow else None)
                print(f"{name:<22}{layout:<8}{tps / 1e6:>18.2f}{per * 1e6:>16.0f}")
        for workers in (0, 2):
            tps = loader_rate(root / "plan-packed", ipc_ds, workers)
            print(
                f"{f'DataLoader w={workers} IPC':<22}{'packed':<8}{tps / 1e6:>18.1f}{'(total)':>16}"
            )
        print()
        print(
            f"{'model (CPU, fp32)':<22}{'pad_to':>8}{'collate ms':>12}{'step ms':>10}{'overhead':>10}"
        )
        for preset in ("tiny", "small"):
            for name, ds in (("IPC", ipc_ds), ("Parquet", pq_ds)):
                c, s, t = model_step_time(
                    root / "plan-model", ds, preset, reps=4 if args.quick else 8
                )
                print(
                    f"{preset + ' / ' + name:<22}{t:>8}{c * 1e3:>12.2f}{s * 1e3:>10.1f}{c / s:>10.2%}"
                )


if __name__ == "__main__":
    main()
