"""A rollout batch shaped as verl holds one, and a PPO-style clipped loss, for the online tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch


def verl_batch(prompts: np.ndarray, responses: np.ndarray, vocab: int = 256, seed: int = 0
               ) -> dict[str, object]:  # fmt: skip
    """Prompts left-padded to the longest, responses right-padded after them, as verl's
    ``DataProto.batch`` holds a rollout: ``input_ids`` / ``attention_mask`` / ``position_ids``
    ``[B, P + R]``, ``responses`` / ``response_mask`` / ``old_log_probs`` / ``advantages``
    ``[B, R]``, and per sample ``scores`` ``[B]`` and ``uid`` (a list)."""
    g = torch.Generator().manual_seed(seed)
    b, p, r = len(prompts), int(prompts.max()), int(responses.max())
    ids = torch.zeros(b, p + r, dtype=torch.long)
    mask = torch.zeros(b, p + r, dtype=torch.long)
    for i, (a, c) in enumerate(zip(prompts.tolist(), responses.tolist(), strict=True)):
        ids[i, p - a : p + c] = torch.randint(1, vocab, (a + c,), generator=g)
        mask[i, p - a : p + c] = 1
    resp_mask = mask[:, p:].clone()
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(dim=1) - 1).clamp(min=0),
        "responses": ids[:, p:].clone(),
        "response_mask": resp_mask,
        "old_log_probs": -torch.rand(b, r, generator=g) * resp_mask,
        "advantages": torch.randn(b, 1, generator=g).expand(b, r) * resp_mask,
        "scores": torch.randn(b, generator=g),
        "uid": [f"prompt-{i // 4}" for i in range(b)],
    }


def clipped_token_losses(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor,
                         mask: torch.Tensor, clip: float = 0.2) -> torch.Tensor:  # fmt: skip
    """PPO's clipped surrogate per token (0 where ``mask`` is 0)."""
    ratio = torch.exp(logp - old)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    return -surrogate * mask


ROOT = Path(__file__).resolve().parents[2]


def torchrun(nproc: int, script: Path, *args: object, timeout: float = 300) -> str:
    """``torchrun --standalone`` of ``script`` on the CPU (one thread a process, this checkout
    first on the path) in a session of its own, so a timeout kills every rank; its stdout."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(script), *map(str, args)]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=path)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          cwd=ROOT, start_new_session=True) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    assert proc.returncode == 0, f"rc={proc.returncode}\n{out}\n{err[-4000:]}"
    return out
