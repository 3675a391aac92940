"""``varpack compile`` / ``compile_kernels``: every kernel ``plan_batch`` reaches is compiled ahead,
and a call that has to compile says so, once, rather than stalling silently."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from numba import njit
from testkit import cli

from varpack.online import batch as online_batch
from varpack.online import compile_kernels, plan_batch
from varpack.plan import numba_cache

# A fresh process: compile_kernels, then the kernels (and signatures) it left in memory; then a
# sweep of plan_batch's options: what they load beyond that, compile_kernels missed.
SWEEP = textwrap.dedent(
    """
    import itertools, json, sys
    import numpy as np
    from numba.core.registry import CPUDispatcher
    from varpack.errors import VarpackError
    from varpack.online import compile_kernels, plan_batch

    def loaded():
        out = set()
        for name, mod in list(sys.modules.items()):
            if name.startswith("varpack"):
                for v in list(vars(mod).values()):
                    if isinstance(v, CPUDispatcher):
                        out |= {f"{v.py_func.__module__}.{v.__name__}{s}" for s in v.overloads}
        return out

    compile_kernels()
    before = loaded()
    lens = np.random.default_rng(5).integers(1, 9000, 1500)
    planned = 0
    grid = itertools.product(("micro", "step"), ("packed", "padded"), ("tokens", "flops",
        "padded"), ("alone", "split", "error"), (None, 4), (None, 8), (False, True), (1, 64),
        (1, 2))
    for sync, layout, cost, oversize, shapes, groups, fwd, multiple, pp in grid:
        kw = dict(sync=sync, layout=layout, cost=cost, oversize=oversize, max_shapes=shapes,
                  groups=groups, forward_only=fwd, pad_multiple=multiple, pp=pp)
        if cost == "flops" and pp == 1:  # Skrull's dimensions, and a model's exact FLOPs
            kw.update(hidden=896, kv_hidden=128, layers=24)
        elif cost == "flops":
            kw.update(model="gemma-2-2b")
        try:
            plan = plan_batch(lens, dp=4, max_tokens=8192, mini_batches=1 if fwd else 3,
                              loss_tokens=lens // 2, **kw)
        except VarpackError:
            continue
        plan.figures, plan.steps, plan.sample_step, plan.step_loss_tokens
        planned += 1
    print(json.dumps({"planned": planned, "missed": sorted(loaded() - before)}))
    """
)


@pytest.mark.slow
def test_compile_kernels_leaves_plan_batch_nothing_to_compile() -> None:
    proc = subprocess.run([sys.executable, "-c", SWEEP], capture_output=True, text=True,
                          check=True, timeout=600)  # fmt: skip
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["planned"] >= 100  # the sweep planned most combinations
    assert got["missed"] == []


def _fresh_kernel(module: str) -> Any:
    """A kernel never compiled before, as if defined in ``module``."""

    def twice(x):  # type: ignore[no-untyped-def]
        return 2 * x

    twice.__module__ = module
    return njit(twice)  # no cache: compiled here


def test_the_first_compile_of_a_varpack_kernel_is_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(numba_cache._Announce, "said", False)
    caplog.set_level(logging.WARNING, logger="varpack")
    with numba_cache.announce_compiles("compiling, once"):
        _fresh_kernel("elsewhere.module")(1)  # not varpack's: not said
    assert caplog.messages == []
    with numba_cache.announce_compiles("compiling, once"):
        _fresh_kernel("varpack.plan.kernels.made_up")(1)
        _fresh_kernel("varpack.plan.kernels.made_up")(1)
    with numba_cache.announce_compiles("compiling, once"):
        _fresh_kernel("varpack.plan.kernels.made_up")(1)
    assert caplog.messages == ["compiling, once"]  # once per process
    _fresh_kernel("varpack.plan.kernels.made_up")(1)  # outside: nothing is listening


def test_plan_batch_says_it_compiles(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A plan_batch whose kernels are not cached yet says so (here: a kernel it meets first)."""
    monkeypatch.setattr(numba_cache._Announce, "said", False)
    caplog.set_level(logging.WARNING, logger="varpack")
    real = online_batch.plan_batch_arrays
    kernel = _fresh_kernel("varpack.plan.batch")

    def planning(*args, **kwargs):  # type: ignore[no-untyped-def]
        kernel(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(online_batch, "plan_batch_arrays", planning)
    plan_batch(np.arange(1, 65), dp=2, max_tokens=4096)
    assert caplog.messages == [online_batch.COMPILING]
    assert "varpack compile" in online_batch.COMPILING


def test_compile_kernels_is_quiet_about_compiling(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(numba_cache._Announce, "said", False)
    caplog.set_level(logging.WARNING, logger="varpack")
    compile_kernels()
    assert caplog.messages == []
    assert numba_cache._Announce.said  # what follows in this process was asked for too


def test_varpack_compile_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numba_cache._Announce, "said", False)
    out = cli("compile").stdout
    assert out.startswith("varpack's kernels compiled and cached in ") and out.count("\n") == 1
    assert cli("compile", "-q").stdout == ""
