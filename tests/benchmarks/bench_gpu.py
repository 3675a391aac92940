"""GPU benchmark: what each attention path and batch layout gives on one GPU, end to end.

    PYTHONPATH=$PWD python tests/benchmarks/bench_gpu.py --out bench-out/gpu    # one GPU, < 8 min
    python tests/benchmarks/bench_gpu.py --quick --device cpu --compile-backend aot_eager --out X

Without CUDA (and without ``--device cpu``) it says so and exits 0: ``make bench`` skips it on a
CPU machine. Needs torch, numpy, pyarrow, varpack's CLI (click, rich, numba); not polars,
flash-attn or transformers.

Data, made on the spot: ``varpack synth --tokenized`` long-tail lengths capped at the budget,
``varpack lengths --arrow-copy`` (memory-mapped tokens), then ``varpack plan`` (shuffled order)
into: packed with a 16K-token budget and grad-accum 4; the same with ``--max-shapes 4``; with
``--pack-to 16384``; padded fixed batches of 4 (``--shuffle-window 1``: random); padded with a
16K budget (shuffle window 8: length-grouped). Model: the ``100m`` preset of
:mod:`varpack.torch.model` in bf16 autocast, AdamW, 5 warm-up then 20 timed optimizer steps.

Each row: real (unpadded) tokens/s, padded fraction, peak GPU memory, model FLOPs utilisation
(useful FLOPs of the real tokens, causal attention counted per sample, over the GPU's bf16 peak),
graphs compiled after warm-up, and tokens/s against the reference of the same compile mode: the
same model on full-length causal rows of the budget (no sample boundaries, no padding, one
shape), eager for the eager rows, ``torch.compile`` (static) for the compiled ones. A reference,
not a bound: short samples cost less attention per token than full rows, so a packed row may pass
it. Then the best varpack row against the padded baselines, and the reader's share: the best
eager row's model steps with the batches already on the GPU against the full loop (target <= 2 %;
DataLoader workers by default from the CPUs per GPU, ``varpack.torch.workers``). Results: OUT.md,
OUT.json. A row that cannot run here (a missing kernel) says why; one that runs out of memory says
"OOM at this budget"; one that fails otherwise records its error. ``--time-budget`` counts from
the start (data and plans included): rows not started within it are skipped and say so. The rows,
their order and the report made of their figures: ``gpu_report.py``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, however started

from gpu_report import (  # noqa: E402
    COMPILED_REFERENCE,
    ORDER,
    REFERENCE,
    Row,
    best_row,
    make_rows,
    markdown,
    ratios,
)

from varpack.torch import (  # noqa: E402
    ParquetTokenDataset,
    PlanLoader,
    compile_warmup,
    compiled_graphs,
    dummy_batch,
    normalise,
    resolve_backend,
    token_loss_sum,
)
from varpack.torch.attention import BackendUnavailableError  # noqa: E402
from varpack.torch.model import PRESETS, GPTConfig, TinyGPT, model_inputs  # noqa: E402
from varpack.torch.workers import default_workers  # noqa: E402

PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "H800": 989.4, "A100": 312.0, "L40": 181.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="writes OUT.md and OUT.json")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in seconds")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None)
    p.add_argument("--budget", type=int, default=None, help="tokens per micro-batch")
    p.add_argument("--grad-accum", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="timed optimizer steps")
    p.add_argument("--warmup-steps", type=int, default=None)
    p.add_argument("--samples", type=int, default=None, help="synthetic samples")
    p.add_argument("--max-shapes", type=int, default=None, help="shape limit of the shapes rows")
    p.add_argument("--workers", type=int, default=None,
                   help="DataLoader workers (default: from the CPUs per GPU)")  # fmt: skip
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--peak-tflops", type=float, default=None, help="default: from the GPU's name")
    p.add_argument("--time-budget", type=float, default=330.0,
                   help="s from the start; rows not started within it are skipped")  # fmt: skip
    p.add_argument("--rows", default=None, help="row numbers to run (1-10, comma-separated)")
    args = p.parse_args(argv)
    quick = {"preset": "tiny", "budget": 256, "grad_accum": 2, "steps": 2, "warmup_steps": 1,
             "samples": 400, "max_shapes": 2}  # fmt: skip
    full = {"preset": "100m", "budget": 16384, "grad_accum": 4, "steps": 20, "warmup_steps": 5,
            "samples": 12000, "max_shapes": 4}  # fmt: skip
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def vp(*args: object) -> None:
    """Run a varpack command (the CLI, in this process: one interpreter start-up, not seven)."""
    from varpack.cli import main as cli

    cli([*map(str, args), "-q"], standalone_mode=False)


def prepare(args: argparse.Namespace, vocab: int, root: Path) -> tuple[Path, dict[str, Path]]:
    """Synthesize, measure and plan; returns (token copy, plan directory per key)."""
    b, ga = args.budget, args.grad_accum
    vp("synth", root / "tok", "--tokenized", "-n", args.samples, "--max-len", b, "--shards", 2,
       "--vocab-size", vocab, "--seed", 1)  # fmt: skip
    vp("lengths", root / "tok", root / "meta", "--id-column", "sample_id",
       "--arrow-copy", root / "tok.arrow")  # fmt: skip
    common = ["--grad-accum", ga, "--order", "shuffle", "--seed", 1]
    budget = ["--max-tokens", b, "--pad-multiple", 64]
    specs = {
        "packed": budget,
        "shapes": [*budget, "--max-shapes", args.max_shapes],
        "packto": ["--max-tokens", b, "--pack-to", b],
        "fixed": ["--batching", "fixed", "--batch-size", 4, "--layout", "padded",
                  "--shuffle-window", 1],
        "grouped": [*budget, "--layout", "padded"],
    }  # fmt: skip
    for key, extra in specs.items():
        vp("plan", root / "meta", root / key, *common, *extra)
    return root / "tok.arrow", {k: root / k for k in specs}


class Bench:
    """Shared state of one benchmark run: device, model config, data and timing helpers."""

    def __init__(self, args: argparse.Namespace, device: torch.device, data: Path) -> None:
        self.args, self.device = args, device
        self.dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
        self.cfg: GPTConfig = PRESETS[args.preset]
        self.dataset = ParquetTokenDataset(data)
        self.peak = args.peak_tflops or peak_tflops(device)
        self.n_params = TinyGPT(self.cfg).num_params()
        self.rows = make_rows(args.budget, args.grad_accum, args.max_shapes)
        gpus = 1 if device.type == "cuda" else 0  # one GPU per process, as in training
        self.workers = args.workers if args.workers is not None else default_workers(gpus)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def flops(self, lens: torch.Tensor) -> float:
        """Useful training FLOPs of samples of these lengths: 6 N S + 6 L d S^2 (causal)."""
        s = lens.to(torch.float64)
        c = self.cfg
        return float((6 * self.n_params * s + 6 * c.n_layers * c.d_model * s * s).sum())

    def model(self, compile: str) -> tuple[Any, torch.optim.Optimizer]:
        """A fresh model (same seed every row), compiled as asked, and its optimizer."""
        torch.manual_seed(0)
        raw = TinyGPT(self.cfg).to(self.device)
        opt = torch.optim.AdamW(raw.parameters(), lr=1e-4, fused=self.device.type == "cuda")
        if compile == "none":
            return raw, opt
        dynamic = compile == "dynamic"
        return torch.compile(raw, backend=self.args.compile_backend, dynamic=dynamic), opt

    def autocast(self) -> Any:
        return torch.autocast(self.device.type, self.dtype, enabled=self.dtype != torch.float32)

    def loss(self, model: Any, batch: Any, attention: str, max_seqlen: str) -> torch.Tensor:
        """The trainer's micro-batch loss: attention inputs once, bf16 autocast, exact scaling."""
        inputs = model_inputs(batch, attention, self.dtype, max_seqlen)
        with self.autocast():
            logits = model(**inputs)
        return normalise(token_loss_sum(logits, batch.labels), batch, 1)


def peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def unavailable(bench: Bench, row: Row, layout: str) -> str | None:
    """Why ``row`` cannot run on this machine, or ``None``."""
    try:
        name = resolve_backend(
            row.attention, bench.device, bench.dtype, layout, compiled=row.compile != "none"
        )
    except BackendUnavailableError as exc:
        return str(exc)
    if name == "flex" and bench.device.type != "cuda":
        return "FlexAttention has no CPU backward"
    return None


def run_loop(bench: Bench, row: Row, model: Any, opt: Any, batches: Any, moved: bool) -> dict:
    """Warm-up steps, then timed steps over ``batches``; figures of the timed part."""
    a, dev = bench.args, bench.device
    step, t0, graphs0 = 0, 0.0, 0
    real = slots = 0
    flops = 0.0
    for batch in batches:
        if step == a.warmup_steps and not t0:
            bench.sync()
            t0, graphs0 = time.perf_counter(), compiled_graphs()
        if not moved:
            batch = batch.to(dev, non_blocking=True)
        bench.loss(
            model, batch, row.attention, "batch" if row.compile == "none" else "row"
        ).backward()
        if step >= a.warmup_steps:
            real += batch.num_tokens
            slots += batch.input_ids.numel()
            flops += bench.flops(batch.seq_lens)
        if batch.is_last_micro:
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step == a.warmup_steps + a.steps:
                break
    bench.sync()
    secs = time.perf_counter() - t0
    if step < a.warmup_steps + a.steps:
        raise RuntimeError(f"the plan has only {step} steps; lower --steps or raise --samples")
    return {"seconds": secs, "tokens_per_s": real / secs, "padded_frac": 1 - real / max(slots, 1),
            "tflops": flops / secs / 1e12, "recompiles": compiled_graphs() - graphs0}  # fmt: skip


def run_row(bench: Bench, row: Row, plan: Path, preload: bool = False) -> dict:
    """One row: a fresh model, the plan's first steps through the reader (or preloaded)."""
    a = bench.args
    workers = bench.workers
    loader = PlanLoader(plan, bench.dataset, rank=0, num_workers=workers,
                        pin_memory=bench.device.type == "cuda", prefetch_factor=4 if workers else None)  # fmt: skip
    why = unavailable(bench, row, loader.layout)
    if why:
        return {"status": f"unavailable: {why}"}
    compiled = row.compile != "none"  # auto as the trainer resolves it: mask, not segments
    row = replace(row, attention=resolve_backend(row.attention, bench.device, bench.dtype,
                                                 loader.layout, compiled=compiled))  # fmt: skip
    model, opt = bench.model(row.compile)
    warm_s = 0.0
    if row.compile == "static":
        t = time.perf_counter()
        compile_warmup(model, loader, 0, lambda s: dummy_batch(s, loader.layout).to(bench.device),
                       lambda m, b: bench.loss(m, b, row.attention, "row"))  # fmt: skip
        warm_s = time.perf_counter() - t
    batches: Any = loader
    if preload:  # the same micro-batches, already on the device: the model's time alone
        batches = _take(loader, a.warmup_steps + a.steps, bench.device)
    out = run_loop(bench, row, model, opt, batches, moved=preload)
    out.update(status="ok", attention=resolve_backend(row.attention, bench.device, bench.dtype,
               loader.layout), warmup_compile_s=warm_s)  # fmt: skip
    return out


def _take(loader: PlanLoader, steps: int, device: torch.device) -> list:
    """The micro-batches of the first ``steps`` steps, moved to ``device``."""
    out: list = []
    for batch in loader:
        out.append(batch.to(device))
        if batch.is_last_micro and batch.step + 1 >= steps:
            break
    return out


def run_reference(bench: Bench, compile: str) -> dict:
    """The reference: the same model and steps on full-length causal rows (attn=None:
    is_causal), compiled as asked (the warm-up steps hold the compilation)."""
    a = bench.args
    model, opt = bench.model(compile)
    pos = torch.arange(a.budget, device=bench.device)[None]
    g = torch.Generator().manual_seed(0)
    n = (a.warmup_steps + a.steps) * a.grad_accum
    ids_all = torch.randint(0, bench.cfg.vocab_size, (n, 1, a.budget), generator=g).to(bench.device)
    items = [(ids_all[k], (k + 1) % a.grad_accum == 0) for k in range(n)]
    t0, steps, flops = 0.0, 0, 0.0
    lens = torch.tensor([a.budget])
    for ids, last in items:
        if steps == a.warmup_steps and not t0:
            bench.sync()
            t0 = time.perf_counter()
        with bench.autocast():
            logits = model(ids, pos)
        token_loss_sum(logits, ids).div(a.budget).backward()
        flops += bench.flops(lens) if steps >= a.warmup_steps else 0.0
        if last:
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
    bench.sync()
    secs = time.perf_counter() - t0
    tokens = a.steps * a.grad_accum * a.budget
    return {"status": "ok", "attention": "causal", "seconds": secs, "tokens_per_s": tokens / secs,
            "padded_frac": 0.0, "tflops": flops / secs / 1e12, "recompiles": 0}  # fmt: skip


def measure(bench: Bench, plans: dict[str, Path], rows: list[int], start: float) -> dict:
    """The rows in :data:`ORDER` (those started after the time budget are skipped), the
    references, and the reader share (after the eager rows, before the compiled ones)."""
    results: dict[int, dict] = {}
    reader: dict[str, Any] = {"status": "skipped: time budget"}
    compiled = any(bench.rows[j].compile != "none" for j in rows)
    for k in ORDER:
        if k == COMPILED_REFERENCE and time.perf_counter() - start <= bench.args.time_budget:
            reader = reader_share(bench, plans, results)  # after the eager rows
        if not (k in rows or k == REFERENCE or (k == COMPILED_REFERENCE and compiled)):
            continue
        if time.perf_counter() - start > bench.args.time_budget:
            results[k] = {"row": k + 1, "status": "skipped: time budget"}
            continue
        results[k] = {"row": k + 1, **measure_row(bench, k, plans)}
    ratio = ratios(bench.rows, results)
    ordered = {bench.rows[k].name: results[k] for k in sorted(results)}
    return {"rows": ordered, "ratios": ratio, "reader": reader}


def measure_row(bench: Bench, k: int, plans: dict[str, Path]) -> dict:
    """One row with its wall time and peak memory; an error is recorded, not raised."""
    row = bench.rows[k]
    print(f"bench_gpu: {row.name} ...", flush=True)
    if bench.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(bench.device)
    t = time.perf_counter()
    try:
        if k in (REFERENCE, COMPILED_REFERENCE):
            res = run_reference(bench, row.compile)
        else:
            res = run_row(bench, row, plans[row.plan])
    except torch.OutOfMemoryError as exc:  # a baseline this budget does not fit: say so
        res = {"status": "OOM at this budget", "detail": str(exc).split(". GPU")[0][:200]}
    except Exception as exc:  # a failing row is a result too; the others still run
        traceback.print_exc()
        res = {"status": f"error: {type(exc).__name__}: {exc}"[:300]}
    if res.get("status") != "ok" and bench.device.type == "cuda":
        gc.collect()  # the failed row's tensors, before the next row allocates
        torch.cuda.empty_cache()
    res["wall_s"] = time.perf_counter() - t
    if bench.device.type == "cuda" and res.get("status") == "ok":
        res["peak_gib"] = torch.cuda.max_memory_allocated(bench.device) / 2**30
    return res


def reader_share(bench: Bench, plans: dict[str, Path], results: dict) -> dict:
    """The best uncompiled varpack row again, its micro-batches moved to the device first."""
    best = best_row(bench.rows, results, compiled=False)
    if best is None:
        return {"status": "no varpack row ran"}
    row = bench.rows[best]
    try:
        moved = run_row(bench, row, plans[row.plan], preload=True)
    except Exception as exc:  # reported like a failing row
        traceback.print_exc()
        return {"status": f"error: {type(exc).__name__}: {exc}"[:300]}
    full = results[best]["seconds"]
    share = (full - moved["seconds"]) / full
    return {"row": row.name, "full_loop_s": full, "preloaded_s": moved["seconds"],
            "share": share, "target": 0.02, "ok": share <= 0.02}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    if args.device == "auto" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; skipped (--device cpu runs it on the CPU)")
        return 0
    device = torch.device("cpu" if args.device == "cpu" else "cuda")
    rows = [int(x) - 1 for x in args.rows.split(",")] if args.rows else list(range(REFERENCE))
    cfg = PRESETS[args.preset]
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        t = time.perf_counter()
        data, plans = prepare(args, cfg.vocab_size, Path(tmp))
        print(f"bench_gpu: data and plans in {time.perf_counter() - t:.1f}s", flush=True)
        bench = Bench(args, device, data)
        measured = measure(bench, plans, rows, start)
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "preset": args.preset, "params": bench.n_params,
              "dtype": args.dtype, "budget": args.budget, "grad_accum": args.grad_accum,
              "steps": args.steps, "warmup_steps": args.warmup_steps, "peak_tflops": bench.peak,
              "workers": bench.workers, "cpus": len(os.sched_getaffinity(0)),
              **measured}  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
