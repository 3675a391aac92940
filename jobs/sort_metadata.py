#!/usr/bin/env python
"""``mpirun`` job entry for the distributed metadata sort (the same driver as ``varpack sort``).

    mpirun -n 8 python jobs/sort_metadata.py METADATA/ SORTED/ [--key seq_len] [--single-file]
    srun python jobs/sort_metadata.py ...            (see jobs/sort.slurm)

Exit codes: 0 success; 2 bad input or options (the failing rank prints ``rank R: message``, every
rank exits, nothing is written); 1 an unexpected error (traceback printed by its rank).
"""

from __future__ import annotations

import argparse
import sys

from varpack.errors import VarpackError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Distributed sample sort of sequence-length metadata.")
    ap.add_argument("input", help="metadata: a Parquet file, a directory or a glob")
    ap.add_argument("output", help="output directory (or file with --single-file)")
    ap.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="COL",
        help="sort key (repeatable; default seq_len)",
    )
    ap.add_argument(
        "--descending",
        action="append",
        default=[],
        metavar="COL",
        help="descending key (repeatable)",
    )
    ap.add_argument("--single-file", action="store_true", help="one memory-mappable binary file")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing output")
    ap.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    ap.add_argument("--oversample", type=int, default=1024, help="splitter samples per rank")
    args = ap.parse_args(argv)

    from varpack.sort.driver import SortFailed, sort_metadata

    try:
        sort_metadata(
            args.input,
            args.output,
            keys=args.key or ("seq_len",),
            descending=args.descending,
            single_file=args.single_file,
            overwrite=args.overwrite,
            quiet=args.quiet,
            oversample=args.oversample,
        )
    except VarpackError as exc:
        print(f"varpack: error: {exc}", file=sys.stderr)
        return 2
    except SortFailed as exc:
        if str(exc):
            print(f"varpack: error: {exc}", file=sys.stderr)
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
