"""Brief, seeded training of a zoo model on byte windows of the corpus's train split."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from exporters.backbone import LanguageModel, next_token_nll
from exporters.corpus import random_windows


@dataclass(frozen=True)
class Schedule:
    steps: int = 1000
    batch: int = 32
    length: int = 64
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.01
    clip: float = 1.0
    log_every: int = 100


def train(
    model: LanguageModel,
    data: np.ndarray,
    eval_ids: torch.Tensor,
    schedule: Schedule = Schedule(),
    seed: int = 0,
) -> list[dict]:
    """Train `model` in place; return the loss curve as rows of step, train and eval NLL."""
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(
        model.parameters(), lr=schedule.lr, betas=(0.9, 0.95), weight_decay=schedule.weight_decay
    )
    curve, recent = [], []
    for step in range(1, schedule.steps + 1):
        for group in opt.param_groups:
            group["lr"] = schedule.lr * _lr_factor(step, schedule)
        model.train()
        batch = torch.from_numpy(random_windows(data, schedule.batch, schedule.length, rng))
        loss, nll = model.loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), schedule.clip)
        opt.step()
        recent.append(nll.item())
        if step % schedule.log_every == 0 or step == schedule.steps:
            curve.append(
                {
                    "step": step,
                    "train_nll": round(float(np.mean(recent)), 4),
                    "eval_nll": round(eval_nll(model, eval_ids), 4),
                }
            )
            recent = []
    return curve


def _lr_factor(step: int, s: Schedule) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step <= s.warmup:
        return step / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def eval_nll(model: LanguageModel, input_ids: torch.Tensor, one_by_one: bool = False) -> float:
    """Return the mean next-token NLL (nats) of the model's inference forward on input_ids.

    `one_by_one` runs each input as its own batch (EarlyExit decides per batch).
    """
    model.eval()
    batches = input_ids.split(1) if one_by_one else (input_ids,)
    total = sum(next_token_nll(model(b)[0], b).item() * len(b) for b in batches)
    return total / len(input_ids)
