"""``varpack compile``: compile the kernels a training job runs, once per install or image."""

from __future__ import annotations

import time

import click

from varpack.metadata import token_check
from varpack.online import compile_kernels


@click.command("compile")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing.")
def compile_kernels_command(quiet: bool) -> None:
    """Compile varpack's numba kernels ahead and keep them in numba's cache: those of
    varpack.online.plan_batch (every option) and of the token copy's reader.

    numba compiles a kernel on its first call after an install or an upgrade (up to a minute of
    CPU for plan_batch's), then every process loads it from the cache. Run this once where the
    package is installed (say, when building a training image) so that no rank pays it at its
    first batch; seconds when the kernels are cached already.
    """
    start = time.perf_counter()
    compile_kernels()
    token_check.warm()
    if not quiet:
        click.echo(f"varpack's kernels compiled and cached in {time.perf_counter() - start:.1f} s")
