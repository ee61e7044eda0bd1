"""The next token of each row of a batch, chosen as the row's own request asks: the argmax
for a greedy row, a draw at the row's temperature from the row's own generator for a sampled
one. Both ways of generating (the static batches and the token loop) choose with `choose`,
so a seeded request draws the same tokens from the same logits whichever way it takes.

The logits are shifted so that their maximum is 0 before the division, in float32: the
quotients are then at most 0, never infinite at the top, and softmax gets no `inf - inf`
however small the temperature (a tiny one leaves only the argmax, as greedy does).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A sampled request's own generator: seeded with its seed, or from torch's global one."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()))
    return torch.Generator(device=device).manual_seed(seed)


def choose(
    scores: torch.Tensor, temperatures: torch.Tensor, generators: Mapping[int, torch.Generator]
) -> torch.Tensor:
    """Each row's next token, shape (rows, 1): a draw at the row's temperature from
    `generators[row]`, or the argmax for a row without one. One draw per sampled row."""
    logits = scores.float()
    top = logits.max(dim=-1, keepdim=True).values
    divisor = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures))
    probabilities = torch.softmax((logits - top) / divisor.unsqueeze(1), dim=-1)
    chosen = scores.argmax(dim=-1, keepdim=True)
    # Scores past float (NaN, infinite) leave no distribution: such a row keeps its argmax,
    # as multinomial would raise, in the token loop's step for every sequence of it.
    drawable = torch.isfinite(probabilities).all(dim=-1).tolist() if generators else []
    for row, drawing in generators.items():
        if drawable[row]:
            chosen[row] = torch.multinomial(probabilities[row], 1, generator=drawing)
    return chosen


def only(scores: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Scores that leave each row its chosen token alone: any argmax or draw then takes it."""
    return torch.full_like(scores, -torch.inf, dtype=torch.float32).scatter(1, chosen, 0.0)
