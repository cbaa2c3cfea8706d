"""Nested variance decomposition of one coefficient family, from mergeable sums.

The family's values c[g, b, t] are grouped by cell g = (layer, slot) — every slot of every
tensor of the family — then by input b within the cell, then by token t. The total sum of
squares around the grand mean splits exactly into

    between cells               Σ_g n_g (mean_g − mean)²         what a static profile keeps
    between inputs within cells Σ_g,b n_gb (mean_gb − mean_g)²
    between tokens within those Σ (c − mean_gb)²

and their shares of the total are `layer_slot_share`, `input_share`, `token_share`.
`eta2_layer` is the share explained by layer identity alone (groups = layers).

FamilyVariance keeps, per cell, Σ c and the number of values over all inputs, and per input
the scalars Σ c² and Σ_g (Σ_t c)² / n_gb; the same under every bootstrap resample. Padded
positions (an attention mask's 0) are left out of every sum and count. Its size depends on the
number of cells and resamples, never on the number of inputs; merging adds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.metrics.stats import Estimate, estimate
from graphaudit.replay.conditions import token_axis, token_weights

if TYPE_CHECKING:
    from graphaudit.metrics.bootstrap import PoissonBootstrap
    from graphaudit.replay.capture import CoefficientCache

SHARES = ("eta2_layer", "layer_slot_share", "input_share", "token_share")


@dataclass
class FamilyVariance:
    """Streaming sums for the variance decomposition of one coefficient family."""

    family: str
    tensors: tuple[str, ...]
    cell_layer: np.ndarray  # (cells,) layer of each cell
    cell_sum: np.ndarray  # (cells,) Σ c
    resampled_cell_sum: np.ndarray  # (R, cells)
    cell_count: np.ndarray  # (cells,) values summed: tokens (padded ones left out), or 1, per input
    resampled_cell_count: np.ndarray  # (R, cells)
    scalars: np.ndarray  # (3,) inputs, Σ c², Σ_g,b (Σ_t c)² / n_gb
    resampled_scalars: np.ndarray  # (R, 3)

    @classmethod
    def empty(cls, family: str, coefficients: Sequence[Coefficient], shapes: Mapping[str, tuple[int, ...]],
              token_axes: Mapping[str, int | None], resamples: int) -> FamilyVariance:
        """Sums for `coefficients` (one family) whose batch-first shapes are `shapes`."""
        layers = []
        for c in coefficients:
            shape, t = shapes[c.tensor], token_axes[c.tensor]
            cells = int(np.prod([n for i, n in enumerate(shape) if i not in (0, t)]))
            layers += [c.layer] * cells
        n = len(layers)
        return cls(family, tuple(c.tensor for c in coefficients), np.array(layers), np.zeros(n),
                   np.zeros((resamples, n)), np.zeros(n), np.zeros((resamples, n)), np.zeros(3),
                   np.zeros((resamples, 3)))

    def update(self, values: Mapping[str, np.ndarray], token_axes: Mapping[str, int | None],
               weights: np.ndarray, tokens: np.ndarray | None = None) -> None:
        """Add one chunk of inputs: batch-first `values` per tensor, weights (R × inputs), and
        where those inputs have tokens (inputs × positions; None: no padding), padded positions
        left out of every sum."""
        sums, counts, squares = [], [], 0.0
        for tensor in self.tensors:
            v = np.asarray(values[tensor], dtype=np.float64)
            t = token_axes[tensor]
            v = np.moveaxis(v, t, 1) if t is not None else v[:, None]
            v = v.reshape(v.shape[0], v.shape[1], -1)  # (inputs, tokens, slots)
            if tokens is not None and t is not None and v.shape[1] == tokens.shape[1]:
                v = v * tokens[:, :, None]
                n = tokens.sum(axis=1, dtype=np.float64)
            else:
                n = np.full(v.shape[0], float(v.shape[1]))
            sums.append(v.sum(axis=1))
            counts.append(np.repeat(n[:, None], v.shape[2], axis=1))
            squares = squares + np.einsum("bts,bts->b", v, v)
        cell, count = np.concatenate(sums, axis=1), np.concatenate(counts, axis=1)  # (inputs, cells)
        within = (cell * cell / np.maximum(count, 1.0)).sum(axis=1)  # a cell padded whole sums to 0
        per_input = np.stack([np.ones(cell.shape[0]), squares, within], axis=1)
        self.cell_sum += cell.sum(axis=0)
        self.resampled_cell_sum += weights @ cell
        self.cell_count += count.sum(axis=0)
        self.resampled_cell_count += weights @ count
        self.scalars += per_input.sum(axis=0)
        self.resampled_scalars += weights @ per_input

    def merge(self, other: FamilyVariance) -> FamilyVariance:
        return FamilyVariance(self.family, self.tensors, self.cell_layer,
                              self.cell_sum + other.cell_sum, self.resampled_cell_sum + other.resampled_cell_sum,
                              self.cell_count + other.cell_count,
                              self.resampled_cell_count + other.resampled_cell_count,
                              self.scalars + other.scalars, self.resampled_scalars + other.resampled_scalars)

    def shares(self, level: float) -> dict[str, Estimate]:
        """The four SHARES with bootstrap intervals."""
        value = _shares(self.cell_sum[None], self.scalars[None], self.cell_layer, self.cell_count[None])
        samples = _shares(self.resampled_cell_sum, self.resampled_scalars, self.cell_layer, self.resampled_cell_count)
        return {name: estimate(float(value[name][0]), samples[name], level) for name in SHARES}


def _shares(cell_sum: np.ndarray, scalars: np.ndarray, layer: np.ndarray, counts: np.ndarray) -> dict[str, np.ndarray]:
    """Shares for each row of (cell sums (K × cells), scalars (K × 3), values per cell (K × cells));
    NaN where nothing varies."""
    _, squares, within_cells = scalars.T
    layer_ids = np.unique(layer)
    by_layer = np.stack([cell_sum[:, layer == k].sum(axis=1) for k in layer_ids], axis=1)
    layer_counts = np.stack([counts[:, layer == k].sum(axis=1) for k in layer_ids], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):  # a resample may draw no input at all
        grand = cell_sum.sum(axis=1) ** 2 / counts.sum(axis=1)
        cells = (cell_sum**2 / counts).sum(axis=1)
        layers = (by_layer**2 / layer_counts).sum(axis=1)
        total = squares - grand
        ok = total > 1e-12 * np.maximum(squares, 1e-300)
        share = lambda part: np.where(ok, np.clip(part / total, 0.0, 1.0), np.nan)  # noqa: E731
        return {
            "eta2_layer": share(layers - grand),
            "layer_slot_share": share(cells - grand),
            "input_share": share(within_cells - cells),
            "token_share": share(squares - within_cells),
        }


def cache_variance(cache: CoefficientCache, boot: PoissonBootstrap, level: float, chunk: int = 64,
                   tokens: np.ndarray | None = None):
    """Variance shares per family, and per-layer mean coefficient at each position, streamed over
    `cache`; `tokens` (inputs × positions, False where padded) leaves padded positions out."""
    axes = {c.tensor: token_axis(c) for c in cache.coefficients}
    shapes = {c.tensor: cache.shape(c) for c in cache.coefficients}
    families: dict[str, list[Coefficient]] = {}
    for c in cache.coefficients:
        families.setdefault(c.family, []).append(c)
    sums = {f: FamilyVariance.empty(f, cs, shapes, axes, boot.resamples) for f, cs in families.items()}
    position = {c.tensor: 0.0 for c in cache.coefficients}
    counted = {c.tensor: 0.0 for c in cache.coefficients}  # inputs, less the padded, at each position
    for rows, values in cache.chunks(chunk):
        weights = boot.weights(rows)
        for f in sums.values():
            f.update(values, axes, weights, None if tokens is None else tokens[rows])
        for c in cache.coefficients:
            w = token_weights(c, shapes[c.tensor], tokens, rows)
            v = values[c.tensor] if w is None else values[c.tensor] * w
            position[c.tensor] = position[c.tensor] + v.sum(axis=0, dtype=np.float64)
            counted[c.tensor] = counted[c.tensor] + (len(rows) if w is None else w.sum(axis=0))
    means = tuple((f, tuple(c.layer for c in cs),
                   tuple(_per_position(position[c.tensor] / np.maximum(counted[c.tensor], 1), axes[c.tensor])
                         for c in cs))
                  for f, cs in families.items())
    return tuple((f, s.shares(level)) for f, s in sums.items()), means


def _per_position(mean: np.ndarray, t: int | None) -> np.ndarray:
    """Average a batch-summed tensor over its slot axes, keeping the token axis."""
    if t is None:
        return np.atleast_1d(mean.mean())
    moved = np.moveaxis(mean, t - 1, 0)
    return moved.reshape(moved.shape[0], -1).mean(axis=1)
