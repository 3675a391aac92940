"""Test helpers every folder imports: metadata writers, the CLI runner, an mpiexec launcher."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner, Result

from varpack.cli import main

BIN = Path(sys.executable).parent


def write_metadata(
    path: Path,
    ids: Sequence[int] | np.ndarray,
    lens: Sequence[int] | np.ndarray,
    row_group_size: int | None = None,
    **extra: Sequence[object] | np.ndarray,
) -> Path:
    """Write one metadata shard (int64 ids and lengths, plus any extra columns)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = {
        "sample_id": pa.array(np.asarray(ids, dtype=np.int64)),
        "seq_len": pa.array(np.asarray(lens, dtype=np.int64)),
    }
    cols.update({k: pa.array(v) for k, v in extra.items()})
    pq.write_table(pa.table(cols), path, row_group_size=row_group_size)
    return path


def write_shards(
    root: Path, ids: np.ndarray, lens: np.ndarray, sizes: Sequence[int], **extra: np.ndarray
) -> Path:
    """Split arrays into shards of the given sizes (zeros allowed) under ``root``."""
    assert sum(sizes) == len(ids)
    start = 0
    for k, n in enumerate(sizes):
        sl = slice(start, start + n)
        write_metadata(
            root / f"shard-{k:03d}.parquet",
            ids[sl],
            lens[sl],
            **{c: v[sl] for c, v in extra.items()},
        )
        start += n
    return root


def cli(*args: object, expect: int | None = 0) -> Result:
    """Run ``varpack ARGS`` in-process; assert the exit code unless ``expect`` is None."""
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    if expect is not None:
        assert result.exit_code == expect, (
            f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result


def mpiexec(
    n: int, *args: object, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``mpiexec -n N python -m mpi4py -m varpack ARGS`` (one failing rank aborts all)."""
    exe = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")
    assert exe, "mpiexec not found; run `make install`"
    cmd = [exe, "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "varpack", *map(str, args)]
    env = dict(
        os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1"
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check:
        assert proc.returncode == 0, (
            f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def load_train(name: str) -> ModuleType:
    """``jobs/train.py`` as a module of its own (``name``), so a test calls its ``main`` in-process:
    one run's imports paid once, not once per run."""
    path = Path(__file__).resolve().parents[1] / "jobs" / "train.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
