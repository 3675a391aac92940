"""``PlanLoader``: replay one rank's manifest through a ``torch.utils.data.DataLoader``.

The manifest already says everything: which samples form each micro-batch, in which order, padded
to which shape. The loader is a map-style dataset over manifest rows (``batch_size=None``): each
worker reads and collates one whole micro-batch, and the DataLoader returns them in row order
whatever ``num_workers`` is. Nothing is decided at run time.

Resume is index arithmetic: the cursor is ``(epoch, step, micro)`` of the next micro-batch plus
the plan's fingerprint; restoring looks the row up with one ``searchsorted`` and starts the sampler
there (no replay, no skipped reads). The cursor is the same on every rank (all ranks have the same
micro-batches per step), so rank 0 may save it for everybody.

``epoch`` counts complete passes over the manifest. A multi-epoch plan (``varpack plan --epochs``)
holds all its epochs in one pass, so there ``epoch`` stays 0 until the plan is replayed again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

from varpack.errors import ConfigError, InputError, VarpackError
from varpack.planfile.format import CARRY_PREFIX, Plan, load_plan
from varpack.planfile.schema import FINGERPRINT_KEY
from varpack.torch import cp as cp_mod
from varpack.torch.batch import BlockBatch, PackedBatch, PaddedBatch
from varpack.torch.collate import LAYOUTS, Failed, RawBatch, RowInfo, collate_numpy
from varpack.torch.dataset import fetch_flat
from varpack.torch.launch import launch_env
from varpack.torch.lr import load_lr_factors, step_values
from varpack.torch.state import make_state, read_parent_state, read_state
from varpack.torch.workers import resolve_workers


def plan_fingerprint(plan: Plan) -> str:
    """Identity of a plan: the fingerprint ``varpack plan`` recorded (over config, input and every
    rank file's checksum; :func:`~varpack.planfile.format.load_plan` checks it against plan.json), else
    sha256 over every rank file's checksum, the layout and the step count."""
    recorded = plan.meta.get(FINGERPRINT_KEY)
    if isinstance(recorded, str):
        return recorded[:32]  # the length a loader state has always carried
    doc = {
        "ranks": [(r["file"], r["sha256"], r["rows"]) for r in plan.meta["ranks"]],
        "layout": plan.meta["layout"],
        "num_steps": plan.meta["num_steps"],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def plan_layout(plan: Plan) -> str | None:
    """The collate layout the plan was made for, if plan.json says (``None`` if it does not)."""
    config = plan.meta.get("config") or {}
    if config.get("batching") == "blocks":
        return "blocks"
    layout = config.get("layout")
    return layout if layout in ("packed", "padded") else None


def resolve_rank(rank: int | None, world_size: int | None, dp: int) -> tuple[int, int]:
    """(rank, world size): explicit values, else ``torch.distributed``, else the launcher's
    environment (torchrun's ``RANK``/``WORLD_SIZE``, else Slurm's ``SLURM_PROCID``/``SLURM_NTASKS``:
    :func:`varpack.torch.launch.launch_env`).

    An explicit ``rank`` without ``world_size`` means "read this rank of the plan" (one process
    may read any rank). Otherwise the world size must equal the plan's dp.
    """
    if rank is None:
        if dist.is_available() and dist.is_initialized():
            rank, env_world = dist.get_rank(), dist.get_world_size()
        else:
            rank, env_world = launch_env()[:2]
        world_size = env_world if world_size is None else world_size
    elif world_size is None:
        world_size = dp
    if world_size != dp:
        raise InputError(
            f"the plan was made for dp={dp} data-parallel ranks but this job has world size {world_size}; "
            f"launch {dp} processes, re-plan with --dp {world_size}, or pass rank/world_size "
            "(the data-parallel rank and size) explicitly"
        )
    if not 0 <= rank < dp:
        raise InputError(f"rank {rank} is outside the plan's dp={dp} ranks")
    return rank, world_size


class ManifestRows:
    """A rank's manifest as NumPy columns (list columns as flat values + offsets); O(1) row access."""

    def __init__(self, table: pa.Table, first_step: int = 0) -> None:
        names = set(table.column_names)
        missing = {
            "step",
            "micro",
            "sample_ids",
            "seq_lens",
            "pad_to",
            "lr_factor",
            "step_tokens",
        } - names
        if missing:
            raise InputError(f"manifest lacks columns {sorted(missing)}; re-run varpack plan")
        table = table.combine_chunks()
        col = table.column
        # steps counted from the plan's first (a replanned plan numbers the run's steps)
        self.first_step = first_step
        self.step = col("step").to_numpy() - first_step
        self.micro = col("micro").to_numpy()
        self.pad_to = col("pad_to").to_numpy()
        self.lr_factor = col("lr_factor").to_numpy()
        self.step_tokens = col("step_tokens").to_numpy()
        self.step_samples = col("step_samples").to_numpy()
        self.warmup = col("warmup").to_numpy(zero_copy_only=False)
        self.pad_rows = col("pad_rows").to_numpy() if "pad_rows" in names else None
        self.ids, self.ids_off = _flat(col("sample_ids"))
        self.lens, self.lens_off = _flat(col("seq_lens"))
        n = len(self.step)
        self.has_blocks = "block_index" in names
        self.block, self.block_off = np.zeros(0, np.int32), np.zeros(n + 1, np.int64)
        if self.has_blocks:
            self.block, self.block_off = _flat(col("block_index"))
        # --oversize split: each piece's first token in its document (parallel to sample_ids)
        self.offs = _flat(col("sample_offsets"))[0] if "sample_offsets" in names else None
        self.carry = {
            name[len(CARRY_PREFIX) :]: _carried(col(name))
            for name in table.column_names
            if name.startswith(CARRY_PREFIX)
        }
        if n and np.any(np.diff(self.step) < 0):
            raise InputError("manifest rows are not in step order; re-run varpack plan")
        # The last micro-batch of a step is where DDP must synchronise gradients.
        self.is_last = np.append(self.step[1:] != self.step[:-1], True) if n else np.zeros(0, bool)

    def __len__(self) -> int:
        return len(self.step)

    def row(self, i: int, epoch: int = 0) -> RowInfo:
        a, b = self.ids_off[i], self.ids_off[i + 1]
        return RowInfo(
            step=int(self.step[i]) + self.first_step,
            micro=int(self.micro[i]),
            sample_ids=self.ids[a:b],
            seq_lens=self.lens[self.lens_off[i] : self.lens_off[i + 1]],
            pad_to=int(self.pad_to[i]),
            lr_factor=float(self.lr_factor[i]),
            step_tokens=int(self.step_tokens[i]),
            step_samples=int(self.step_samples[i]),
            warmup=bool(self.warmup[i]),
            is_last_micro=bool(self.is_last[i]),
            epoch=epoch,
            pad_rows=int(self.pad_rows[i]) if self.pad_rows is not None else 0,
            block_index=self.block[self.block_off[i] : self.block_off[i + 1]]
            if self.has_blocks
            else None,
            sample_offsets=self.offs[a:b] if self.offs is not None else None,
            carry={k: v[a:b] for k, v in self.carry.items()} if self.carry else None,
        )

    def index_of(self, step: int, micro: int) -> int:
        """Row of (step, micro), by binary search on the step column."""
        if len(self) and step > int(self.step[-1]):
            return len(self)
        i = int(np.searchsorted(self.step, step)) + micro
        if i >= len(self) or int(self.step[i]) != step or int(self.micro[i]) != micro:
            raise InputError(f"the plan has no micro-batch step {step} micro {micro} on this rank")
        return i


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    arr = column.chunk(0) if column.num_chunks == 1 else pa.concat_arrays(column.chunks)
    offsets = arr.offsets.to_numpy().astype(np.int64)
    return arr.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]], offsets - offsets[0]


def _carried(column: pa.ChunkedArray) -> np.ndarray:
    """A carried list column's flat values, parallel to ``sample_ids`` (same offsets, checked
    by ``varpack validate``): numbers as they are, strings as an object array of ``str`` built
    from the column's distinct values (one Python string per distinct value, not per sample)."""
    arr = column.chunk(0) if column.num_chunks == 1 else pa.concat_arrays(column.chunks)
    offsets = arr.offsets.to_numpy()
    values = arr.values.slice(offsets[0], offsets[-1] - offsets[0])
    if not pa.types.is_string(values.type):
        return values.to_numpy(zero_copy_only=False)
    encoded = values.dictionary_encode()
    names = np.array(encoded.dictionary.to_pylist(), dtype=object)
    return names[encoded.indices.to_numpy(zero_copy_only=False)]


class MicroBatches(Dataset[Any]):
    """Map-style dataset: index ``(epoch, row)`` -> the collated micro-batch of that row."""

    def __init__(
        self,
        rows: ManifestRows,
        dataset: Any,
        layout: str,
        pad_id: int = 0,
        positions: str = "restart",
        split_len: int | None = None,
    ) -> None:
        self.rows, self.dataset, self.layout, self.pad_id = rows, dataset, layout, pad_id
        self.positions = positions  # position ids of pieces (plan.json's split_positions)
        self.split_len = split_len  # pieces are checked against their documents with it

    def __len__(self) -> int:
        return len(self.rows)

    def fetch(
        self, ids: np.ndarray, offsets: np.ndarray | None = None, lens: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        return fetch_flat(self.dataset, ids, offsets, lens, self.split_len)

    def __getitem__(self, index: tuple[int, int]) -> RawBatch | Failed:
        epoch, i = index
        row = self.rows.row(i, epoch)
        try:
            return collate_numpy(row, self.fetch, self.layout, self.pad_id, self.positions)
        except VarpackError as exc:  # sent back whole: a DataLoader worker would wrap it
            return Failed(type(exc), str(exc))

    def batch(self, i: int, epoch: int = 0) -> PackedBatch | PaddedBatch | BlockBatch:
        """The collated batch of row ``i`` (in this process)."""
        raw = self[(epoch, i)]
        if isinstance(raw, Failed):
            raise raw.error()
        return raw.to_batch()


class _RowSampler(Sampler[tuple[int, int]]):
    """Rows ``start .. n-1`` of one epoch, in order."""

    def __init__(self, epoch: int, start: int, n: int) -> None:
        self.epoch, self.start, self.n = epoch, start, n

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((self.epoch, i) for i in range(self.start, self.n))

    def __len__(self) -> int:
        return self.n - self.start


def _identity(x: Any) -> Any:
    return x


class PlanLoader:
    """Iterate this rank's micro-batches of a plan, in execution order, as batch dataclasses.

    ``collate`` picks the layout: ``"packed"`` (:class:`~varpack.torch.batch.PackedBatch`),
    ``"padded"`` (:class:`~varpack.torch.batch.PaddedBatch`) or ``"blocks"``
    (:class:`~varpack.torch.batch.BlockBatch`); ``None`` takes it from plan.json. ``dataset`` is a
    :class:`~varpack.torch.dataset.ParquetTokenDataset` or any map-style dataset keyed by sample id.
    ``num_workers="auto"``: from the CPUs per GPU (:func:`~varpack.torch.workers.default_workers`).
    ``vision``: a Qwen2-VL / Qwen2.5-VL model or its config: the dataset returns each sample as
    its processor's outputs and the loader yields :class:`~varpack.torch.vlm.VisionBatch`
    (:mod:`varpack.torch.vision_rows`).
    """

    def __init__(
        self,
        plan_dir: str | os.PathLike[str],
        dataset: Any,
        rank: int | None = None,
        world_size: int | None = None,
        collate: str | None = None,
        num_workers: int | str = 0,
        pin_memory: bool = False,
        pad_id: int = 0,
        prefetch_factor: int | None = None,
        verify: bool = True,
        multiprocessing_context: Any = None,
        cp_rank: int | None = None,
        cp_size: int | None = None,
        vision: Any = None,
    ) -> None:
        # Each rank checks its own manifest's sha256 (not all dp files: that would read every
        # rank's file in every process).
        self.plan = load_plan(plan_dir, verify=False)
        cp = int(self.plan.meta["layout"].get("cp", 1))
        rank, world_size, self.cp_rank, self.cp_size = cp_mod.resolve_cp(
            rank, world_size, cp_rank, cp_size, cp
        )  # a --cp plan: this CP rank's share of each micro-batch (varpack.torch.cp)
        self.rank, self.world_size = resolve_rank(rank, world_size, self.plan.dp)
        planned = plan_layout(self.plan)
        layout = collate or planned or "packed"
        if layout not in LAYOUTS:
            raise ConfigError(f"collate={layout!r} is not one of {', '.join(LAYOUTS)}")
        if planned is not None and layout != planned:
            raise ConfigError(
                f"{plan_dir}: the plan was made for the {planned!r} layout, not collate={layout!r}"
            )
        self.layout = layout
        table = self.plan.rank_table(self.rank, verify=verify)
        self.first_step = self.plan.first_step  # a replanned plan continues the run's steps
        self.rows = ManifestRows(table, self.first_step)
        self.cp_rows = cp_mod.CPRows(table, self.cp_size) if self.cp_size > 1 else None
        self.fingerprint = plan_fingerprint(self.plan)
        config = self.plan.meta.get("config") or {}
        positions = config.get("split_positions", "restart")
        split_len = config.get("split_len") if config.get("oversize") == "split" else None
        self.dataset: Any = MicroBatches(self.rows, dataset, layout, pad_id, positions, split_len)
        if vision is not None:  # vision-language samples: VisionBatch
            from varpack.torch.vision_rows import vision_rows

            self.dataset = vision_rows(str(plan_dir), layout, self.cp_size, config, self.rows,
                                       dataset, pad_id, vision)  # fmt: skip
        self.num_workers, self.pin_memory = resolve_workers(num_workers), pin_memory
        self.prefetch_factor, self.multiprocessing_context = (
            prefetch_factor,
            multiprocessing_context,
        )
        self._epoch, self._next = 0, 0  # cursor: the next row to yield

    @property
    def path(self) -> Path:
        return self.plan.path

    @property
    def num_steps(self) -> int:
        """The run's steps: this plan's, after the :attr:`first_step` its parents trained."""
        return self.first_step + self.plan.num_steps

    @property
    def grad_accum(self) -> int:
        return self.plan.grad_accum

    def __len__(self) -> int:
        """Micro-batches (not optimizer steps) of one whole pass over this rank's manifest,
        wherever the cursor is: ``num_steps x grad_accum``. See :attr:`steps` for steps."""
        return len(self.rows)

    @property
    def steps(self) -> int:
        """Optimizer steps the next ``for batch in loader`` yields: the steps left from the
        cursor (after :meth:`load_state_dict`, those not done yet), or all :attr:`num_steps` of
        a new pass when the last one finished. One step ends at each ``batch.is_last_micro``."""
        start = self._next if self._next < len(self.rows) else 0
        return int(np.count_nonzero(self.rows.is_last[start:]))

    def lr_factors(self) -> np.ndarray:
        """LR factor of every step, indexed by step (what :class:`VariableBatchSizeLR` takes);
        1 for the steps before :attr:`first_step` (trained on the parent plan)."""
        own = step_values(self.rows.step, self.rows.lr_factor, self.plan.num_steps)
        return np.concatenate((np.ones(self.first_step), own))

    def __iter__(self) -> Iterator[Any]:
        if self._next >= len(self.rows):  # the previous pass finished: start the next one
            self._epoch, self._next = self._epoch + 1, 0
        loader = DataLoader(
            self.dataset,
            batch_size=None,
            sampler=_RowSampler(self._epoch, self._next, len(self.rows)),
            num_workers=self.num_workers,
            pin_memory=False,  # workers send NumPy; pinning happens below, on the tensors
            collate_fn=_identity,
            prefetch_factor=self.prefetch_factor if self.num_workers else None,
            multiprocessing_context=self.multiprocessing_context if self.num_workers else None,
        )
        for raw in loader:
            if isinstance(raw, Failed):
                raise raw.error()
            batch = raw.to_batch()
            if self.cp_rows is not None:
                assert isinstance(batch, PackedBatch)
                batch = cp_mod.shard(batch, self.cp_rows[self._next], self.cp_rank, self.cp_size)
            elif self.pin_memory:
                batch = batch.pin_memory()
            # Advance the cursor only for what the caller received (prefetched rows do not count).
            self._next += 1
            yield batch

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The cursor of the next micro-batch: ``{epoch, step, micro, plan}`` (rank-independent),
        sealed with a checksum (:mod:`varpack.torch.state`)."""
        if self._next >= len(self.rows):
            step, micro = self.num_steps, 0
        else:
            step, micro = int(self.rows.step[self._next]), int(self.rows.micro[self._next])
            step += self.first_step
        return make_state(self.fingerprint, self._epoch, step, micro)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was taken; refuses, in one line, a state from another
        plan, out of range or damaged (:func:`varpack.torch.state.read_state`); a replanned plan
        also takes its parent's state at the step it continues from."""
        parent = self.plan.meta.get("parent")
        if (
            isinstance(state, dict)
            and parent
            and state.get("plan") == parent["plan_fingerprint"][:32]
        ):
            epoch, step, micro = read_parent_state(state, parent, self.num_steps, self.plan.dp)
        else:
            epoch, step, micro = read_state(
                state, self.fingerprint, self.num_steps, self.grad_accum, str(self.path)
            )
            if step < self.first_step:
                raise InputError(
                    f"loader state step {step}: {self.path} holds the run's steps from "
                    f"{self.first_step} on; resume with the plan that holds step {step}"
                )
        self._epoch = epoch
        self._next = self.rows.index_of(step - self.first_step, micro)


__all__ = ["PlanLoader", "ManifestRows", "plan_fingerprint", "resolve_rank", "load_lr_factors"]
