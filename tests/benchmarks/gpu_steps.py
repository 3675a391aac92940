"""What the GPU benchmarks share: one training step of the reference model on a micro-batch, timed.

A micro-batch is given by its sample lengths and its row length (``pad_to``); its tokens are
random and the reader's own collate builds it (a :class:`~varpack.torch.PackedBatch`, padding
tail included), so a step sees what a trainer sees. :class:`Stepper` runs forward and backward of
the ``TinyGPT`` preset (bf16 autocast on CUDA, attention ``auto``: torch's varlen kernel on a GPU,
the dense block mask on the CPU) and times each micro-batch: with CUDA events on a GPU (one
synchronisation at the end of the list, so launches overlap as in training), with
``time.perf_counter`` on the CPU. FLOPs come from varpack's own cost model
(:mod:`varpack.plan.cost`), so a prediction and a measurement speak of the same micro-batches.

Imports torch, NumPy and varpack only (no polars, flash-attn or transformers).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from varpack.plan.cost import linear_flops_per_token, sample_flops
from varpack.plan.models import ModelDims, ModelSpec
from varpack.torch import normalise, token_loss_sum
from varpack.torch.batch import PackedBatch
from varpack.torch.collate import RowInfo, collate
from varpack.torch.model import PRESETS, TinyGPT, model_inputs


def pick_device(name: str | None) -> torch.device | None:
    """``cuda`` (the default where present), ``cpu`` when asked; ``None``: no CUDA and not asked."""
    if name in (None, "auto"):
        return torch.device("cuda") if torch.cuda.is_available() else None
    return torch.device(name)


@contextmanager
def steady(device: torch.device) -> Iterator[None]:
    """On the CPU, one torch thread while inside: a shared CPU gives steadier timings to one
    thread than to threads that wait for each other (restored after)."""
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def dims_of(preset: str) -> ModelDims:
    """The preset's dimensions for varpack's FLOPs model (no GQA: kv hidden = hidden)."""
    c = PRESETS[preset]
    return ModelDims(c.d_model, c.d_model, c.n_layers)


def spec_of(preset: str) -> ModelSpec:
    """The preset's :class:`~varpack.plan.models.ModelSpec`: ``TinyGPT`` has a q/k/v/o attention
    of ``n_heads`` heads (no GQA), a GELU MLP of ``mlp_ratio x d_model`` (two matmuls: not gated,
    which no Hugging Face family of ``spec_from_config`` has, so the spec is written from the
    modules) and a tied LM head over every position.

    >>> spec_of("tiny").describe()
    'tinygpt: 2 layers, hidden 64, 4 heads (4 kv) x 16, MLP 256, vocab 256'
    """
    c = PRESETS[preset]
    return ModelSpec("tinygpt", hidden=c.d_model, layers=c.n_layers, heads=c.n_heads,
                     kv_heads=c.n_heads, head_dim=c.d_model // c.n_heads,
                     intermediate=c.mlp_ratio * c.d_model, gated=False, vocab=c.vocab_size,
                     windows=(None,) * c.n_layers)  # fmt: skip


def flops_parts(lens: np.ndarray, pad_to: int, dims: ModelDims) -> tuple[float, float]:
    """(linear, attention) FLOPs of a packed micro-batch as varpack counts them: the linear part
    over the whole row (padding included), attention per sample.

    >>> flops_parts(np.array([1, 2]), 4, ModelDims(1, 1, 1))
    (96.0, 20.0)
    """
    att = float((sample_flops(lens, dims) - linear_flops_per_token(dims) * lens).sum())
    return linear_flops_per_token(dims) * pad_to, att


def micro_flops(lens: np.ndarray, pad_to: int, dims: ModelDims) -> float:
    """FLOPs of a packed micro-batch under ``--cost flops`` (the samples' own plus the linear
    part of the padding tail): what ``--cost time`` multiplies by its seconds per FLOP."""
    return sum(flops_parts(lens, pad_to, dims))


class Stepper:
    """The reference model on one device, and timed forward + backward steps of micro-batches."""

    def __init__(self, preset: str, device: torch.device, dtype: str = "bf16", seed: int = 0,
                 clock: Callable[[], float] = time.perf_counter):  # fmt: skip
        """``clock``: what times a CPU step (wall-clock; ``time.process_time`` counts the CPU
        seconds of the process alone, which another process on a shared CPU does not add to)."""
        self.device, self.preset, self.clock = device, preset, clock
        self.cuda = device.type == "cuda"
        # bf16 autocast on the GPU; the CPU runs fp32 (its bf16 is an emulation, not a smoke test)
        self.dtype = torch.bfloat16 if dtype == "bf16" and self.cuda else torch.float32
        torch.manual_seed(seed)
        self.model = TinyGPT(PRESETS[preset]).to(device)
        self.vocab = PRESETS[preset].vocab_size
        self.rng = np.random.default_rng(seed)

    def batch(self, lens: np.ndarray, pad_to: int) -> PackedBatch:
        """A packed micro-batch of these sample lengths in a row of ``pad_to``, on the device."""
        lens = np.asarray(lens, dtype=np.int64)
        row = RowInfo(step=0, micro=0, sample_ids=np.arange(len(lens), dtype=np.int64),
                      seq_lens=lens, pad_to=int(pad_to), lr_factor=1.0,
                      step_tokens=int(lens.sum()), step_samples=len(lens), warmup=False,
                      is_last_micro=True)  # fmt: skip
        tokens = self.rng.integers(0, self.vocab, int(lens.sum()), dtype=np.int64)
        out = collate(row, lambda ids: (tokens, lens), "packed")
        assert isinstance(out, PackedBatch)
        return out.to(self.device)

    def step(self, batch: PackedBatch) -> None:
        """Forward and backward (the trainer's loss: attention inputs once, exact scaling)."""
        inputs = model_inputs(batch, "auto", self.dtype, "batch")
        with torch.autocast(self.device.type, self.dtype, enabled=self.dtype != torch.float32):
            logits = self.model(**inputs)
        normalise(token_loss_sum(logits, batch.labels), batch, 1).backward()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def time(
        self,
        batches: Sequence[PackedBatch],
        new_step: Sequence[bool] | None = None,
        reps: int = 1,
        deadline: float | None = None,
        reduce: Callable[[Iterable[float]], float] = statistics.median,
    ) -> np.ndarray:
        """Seconds of each micro-batch's step (the median of ``reps`` passes over the list, or
        what ``reduce`` makes of them; no pass after the first starts past ``deadline``, a
        ``time.perf_counter`` value).

        ``new_step[i]``: gradients are dropped before micro-batch ``i`` (outside the timing), as
        at the start of an optimizer step; by default before every one.
        """
        fresh = [True] * len(batches) if new_step is None else list(new_step)
        passes = [self._pass(batches, fresh)]
        while len(passes) < reps and (deadline is None or time.perf_counter() < deadline):
            passes.append(self._pass(batches, fresh))
        return np.array([reduce(p[i] for p in passes) for i in range(len(batches))])

    def _pass(self, batches: Sequence[PackedBatch], fresh: list[bool]) -> list[float]:
        if not self.cuda:
            out = []
            for b, new in zip(batches, fresh, strict=True):
                if new:
                    self.model.zero_grad(set_to_none=True)
                t = self.clock()
                self.step(b)
                out.append(self.clock() - t)
            return out
        events = []
        for b, new in zip(batches, fresh, strict=True):
            if new:
                self.model.zero_grad(set_to_none=True)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.step(b)
            end.record()
            events.append((start, end))
        self.sync()
        return [s.elapsed_time(e) / 1e3 for s, e in events]

    def peak_memory(self, batch: PackedBatch) -> float | None:
        """Bytes the step allocates above the idle model (CUDA only; ``None`` on the CPU)."""
        if not self.cuda:
            return None
        self.model.zero_grad(set_to_none=True)
        self.sync()
        torch.cuda.reset_peak_memory_stats(self.device)
        idle = torch.cuda.memory_allocated(self.device)
        self.step(batch)
        self.sync()
        return float(torch.cuda.max_memory_allocated(self.device) - idle)

    def warm_up(self, tokens: int, n: int = 3) -> None:
        """A few steps of a full row first (kernel selection, the allocator's pools)."""
        b = self.batch(np.array([tokens // 2, tokens - tokens // 2]), tokens)
        self.time([b] * n)
