"""Record the content hash of every output of the demo flow and of plans covering every option.

    python tests/golden/record.py WORKDIR            # prints {name: sha256} as JSON
    python tests/golden/record.py WORKDIR --bytes    # the files' raw sha256 instead

Runs the demo's data steps (synth -> lengths + token copy -> sort -> plan) through the CLI, then
plans its sorted output under one configuration per option family. The default hashes are of the
*content*: Parquet files by their schema and rows, JSON files with their byte checksums (and
the plan fingerprint built on them) and paths removed, so they survive a pyarrow release that
changes the bytes of an identical table.
``tests/golden/test_golden.py`` compares them with ``tests/golden/hashes.json``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
from click.testing import CliRunner

from varpack.cli import main

#: The demo's data steps (jobs/demo.sh), at its sizes.
DEMO = [
    ["synth", "tokens", "--dist", "long-tail", "--num-samples", "4000", "--max-len", "2048",
     "--shards", "4", "--tokenized", "--pattern", "count", "--vocab-size", "512", "--seed", "7"],
    ["lengths", "tokens", "meta", "--id-column", "sample_id", "--arrow-copy", "tokens.arrow"],
    ["sort", "meta", "sorted"],
    ["plan", "sorted", "plan", "--dp", "2", "--grad-accum", "2", "--max-tokens", "4096",
     "--layout", "packed", "--pad-multiple", "64", "--order", "shuffle", "--seed", "1",
     "--shuffle-window", "8", "--cost", "flops", "--model-preset", "qwen2.5-0.5b",
     "--lr-scaling", "sqrt", "--base-batch-size", "64", "--max-shapes", "8", "--warmup", "reorder"],
]  # fmt: skip

#: One plan per option family, all over the demo's sorted output.
PLANS: dict[str, list[str]] = {
    "budget-packed-curriculum": ["--max-tokens", "4096", "--dp", "2", "--grad-accum", "2"],
    "budget-padded-pad64": ["--max-tokens", "8192", "--layout", "padded", "--pad-multiple", "64",
                            "--dp", "2"],
    "fixed-padded-shuffle": ["--batching", "fixed", "--batch-size", "8", "--layout", "padded",
                             "--order", "shuffle", "--seed", "3", "--dp", "2", "--grad-accum", "2"],
    "fixed-packed": ["--batching", "fixed", "--batch-size", "5", "--dp", "3"],
    "shuffle-epochs-linear-tokens": ["--max-tokens", "4096", "--order", "shuffle", "--seed", "5",
                                     "--shuffle-window", "2", "--epochs", "2", "--dp", "2",
                                     "--lr-scaling", "linear", "--base-batch-size", "16384",
                                     "--base-unit", "tokens"],
    "cost-padded-padded": ["--max-tokens", "8192", "--layout", "padded", "--cost", "padded",
                           "--dp", "4", "--grad-accum", "2"],
    "cost-flops-dims": ["--max-tokens", "4096", "--cost", "flops", "--hidden", "512",
                        "--kv-hidden", "128", "--layers", "8", "--dp", "4"],
    "max-shapes-packed": ["--max-tokens", "4096", "--max-shapes", "4", "--pad-multiple", "64",
                          "--dp", "2", "--warmup", "none"],
    "max-shapes-padded-reorder": ["--max-tokens", "8192", "--layout", "padded", "--max-shapes",
                                  "6", "--dp", "2", "--grad-accum", "2", "--warmup", "reorder",
                                  "--order", "shuffle", "--epochs", "2"],
    "pack-to": ["--pack-to", "4096", "--dp", "2", "--grad-accum", "2", "--warmup", "reorder"],
    "pp-packed": ["--max-tokens", "4096", "--pp", "2", "--grad-accum", "4", "--dp", "2"],
    "pp-padded-shuffle": ["--max-tokens", "8192", "--layout", "padded", "--pp", "2",
                          "--grad-accum", "2", "--dp", "2", "--order", "shuffle",
                          "--max-shapes", "4", "--warmup", "reorder"],
    "pp-padded-fixed": ["--batching", "fixed", "--batch-size", "4", "--layout", "padded",
                        "--pp", "2", "--grad-accum", "2", "--dp", "2"],
    "oversize-drop": ["--max-tokens", "1024", "--oversize", "drop", "--dp", "2"],
    "oversize-alone": ["--max-tokens", "1024", "--oversize", "alone", "--dp", "2",
                       "--layout", "padded"],
    "oversize-split": ["--max-tokens", "1024", "--oversize", "split", "--dp", "2",
                       "--grad-accum", "2", "--order", "shuffle"],
    "oversize-split-len": ["--max-tokens", "4096", "--oversize", "split", "--split-len", "700",
                           "--split-positions", "continue", "--layout", "padded"],
    "blocks": ["--batching", "blocks", "--max-tokens", "8192", "--dp", "2", "--grad-accum", "2"],
    "blocks-shuffle": ["--batching", "blocks", "--block-len", "2048", "--blocks-per-batch", "2",
                       "--block-window", "512", "--order", "shuffle", "--seed", "2", "--dp", "2",
                       "--warmup", "reorder", "--cost", "flops", "--model-preset", "llama-3-8b"],
}  # fmt: skip

# byte checksums, paths, per-rank timing/balance; plan_fingerprint and the checksums of plan.json
# and _index.json hash the rank files' sha256 (bytes that a pyarrow release may change), while
# what they cover is hashed here on its own
_VOLATILE = {"sha256", "source", "balance", "plan_fingerprint", "checksum"}


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def content_hash(path: Path) -> str:
    """sha256 of what a file says: Parquet/Arrow by schema + rows, JSON scrubbed, else bytes."""
    h = hashlib.sha256()
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        h.update(table.schema.remove_metadata().to_string().encode())
        h.update(json.dumps(table.to_pydict(), sort_keys=True).encode())
    elif path.suffix == ".arrow":
        with pa.memory_map(str(path)) as source:
            table = ipc.open_file(source).read_all()
        h.update(table.schema.remove_metadata().to_string().encode())
        h.update(json.dumps(table.to_pydict(), sort_keys=True).encode())
    elif path.suffix == ".json":
        h.update(json.dumps(_scrub(json.loads(path.read_text())), sort_keys=True).encode())
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


def _run(args: list[str]) -> None:
    result = CliRunner().invoke(main, [*args, "--quiet"] if args[0] == "plan" else args)
    if result.exit_code != 0:
        raise SystemExit(f"varpack {' '.join(args)} failed:\n{result.output}")


def record(work: Path, raw_bytes: bool = False) -> dict[str, str]:
    """Run everything under ``work`` (made empty) and hash every output file."""
    import os

    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    for args in DEMO:
        _run(args)
    for name, opts in PLANS.items():
        _run(["plan", "sorted", f"plans/{name}", *opts])
    out = {}
    for path in sorted(p for p in work.rglob("*") if p.is_file()):
        key = str(path.relative_to(work))
        out[key] = (
            hashlib.sha256(path.read_bytes()).hexdigest() if raw_bytes else content_hash(path)
        )
    return out


if __name__ == "__main__":
    print(json.dumps(record(Path(sys.argv[1]), "--bytes" in sys.argv), indent=1, sort_keys=True))
