#!/usr/bin/env python
"""``mpirun`` job entry for the distributed metadata sort: exactly ``varpack sort``.

    mpirun -n 8 python -m mpi4py jobs/sort_metadata.py METADATA/ SORTED/ [--key seq_len] [--single-file]
    srun python -m mpi4py jobs/sort_metadata.py ...       (see jobs/sort.slurm)

It runs the same command (options, messages, signal handling, exit codes) as
``python -m mpi4py -m varpack sort``: 0 success; 2 bad input or options (the failing rank's
message, every rank exits, nothing is written); 1 an environment failure or a bug; 143 / 130 /
129 after SIGTERM / SIGINT / SIGHUP, with the partial output removed on every rank.
``python -m mpi4py`` makes an uncaught error on one rank abort all of them.
"""

from __future__ import annotations

import sys

from varpack.cli import main

if __name__ == "__main__":
    main(["sort", *sys.argv[1:]], prog_name="sort_metadata.py")
