"""A rollout batch shaped as verl holds one, and a PPO-style clipped loss, for the online tests."""

from __future__ import annotations

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
