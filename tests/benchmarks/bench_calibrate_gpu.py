"""Calibrate the memory and time models on measured steps of the reference model, and test them.

    PYTHONPATH=$PWD python tests/benchmarks/bench_calibrate_gpu.py --out bench-out/calib   # one GPU
    python tests/benchmarks/bench_calibrate_gpu.py --device cpu --preset tiny --quick --out X

Measures training steps (forward, backward, bf16 autocast on CUDA) of the ``100m`` preset of
:mod:`varpack.torch.model` on one packed row of T tokens for a range of T, several repetitions
each: peak memory above the idle model (``torch.cuda.max_memory_allocated``, CUDA only) and the
median step time. Writes OUT.csv (``tokens,peak_memory,step_time``), then runs
``varpack calibrate OUT.csv OUT.json --hidden d --kv-hidden d --layers L --holdout 3``: every
third size is held out of the fit, and ``time_error_held_out`` / ``memory_error_held_out`` say
how well the fitted ``a * flops + b`` and ``A * S + B`` predict steps they were not fitted on.
On the CPU there is no allocator peak: only the time model is fitted.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from varpack.torch.model import PRESETS, TinyGPT

GPU_SIZES = [1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 20480, 24576, 32768]
CPU_SIZES = [64, 128, 192, 256, 384, 512]


def _step(model: TinyGPT, tokens: int, device: torch.device, cuda: bool) -> None:
    ids = torch.randint(0, model.cfg.vocab_size, (1, tokens), device=device)
    pos = torch.arange(tokens, device=device)[None]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
        logits = model(ids, pos)
        loss = torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:])
    loss.backward()
    model.zero_grad(set_to_none=True)


def measure(model: TinyGPT, sizes: list[int], reps: int, device: torch.device) -> list[list[float]]:
    """``[tokens, peak_memory (bytes, CUDA) or None, median step seconds]`` per size."""
    cuda = device.type == "cuda"
    rows = []
    for t in sizes:
        _step(model, t, device, cuda)  # warm-up (kernels, allocator)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            idle = torch.cuda.memory_allocated()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            _step(model, t, device, cuda)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        peak = float(torch.cuda.max_memory_allocated() - idle) if cuda else None
        rows.append([t, peak, statistics.median(times)])
        print(f"tokens {t:>6}: step {statistics.median(times) * 1e3:8.2f} ms"
              + (f", activations {peak / 2**20:8.1f} MiB" if peak is not None else ""), flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="OUT.csv and OUT.json are written")
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    ap.add_argument("--preset", default="100m", choices=sorted(PRESETS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.device is None and not torch.cuda.is_available():
        print("no CUDA device: pass --device cpu for the CPU path; nothing measured")
        return 0
    device = torch.device(args.device or "cuda")
    sizes = CPU_SIZES if device.type == "cpu" else GPU_SIZES
    if args.quick:
        sizes = sizes[:4] if device.type == "cpu" else sizes[::2]
    torch.manual_seed(0)
    model = TinyGPT(PRESETS[args.preset]).to(device)
    rows = measure(model, sizes, 2 if args.quick else args.reps, device)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    csv_path = out.with_suffix(".csv")
    with open(csv_path, "w", newline="") as fh:
        w = csv.writer(fh)
        cuda = device.type == "cuda"
        w.writerow(["tokens", "peak_memory", "step_time"] if cuda else ["tokens", "step_time"])
        for t, peak, sec in rows:
            w.writerow([t, peak, sec] if cuda else [t, sec])
    c = model.cfg
    from varpack.cli import main as cli

    json_path = out.with_suffix(".json")
    args_cli = ["calibrate", str(csv_path), str(json_path), "--hidden", str(c.d_model),
                "--kv-hidden", str(c.d_model), "--layers", str(c.n_layers), "--holdout", "3",
                "--overwrite"]  # fmt: skip
    try:
        cli.main(args_cli, prog_name="varpack")
    except SystemExit as exc:
        if exc.code:
            return int(exc.code)
    result = json.loads(json_path.read_text())
    for what in ("memory", "time"):
        held = result.get(f"{what}_error_held_out")
        if held:
            print(
                f"{what} model: held-out error mean {held['mean_pct']:.2f}%, max {held['max_pct']:.2f}%"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
