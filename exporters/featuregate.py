"""FeatureGate: each block's residual branch scaled by a per-token, per-feature sigmoid gate.

Controller of block i (`blocks.{i}.gate`): RMS-norm (no scale) of the block's input →
Linear(d, d) → sigmoid, giving `gate.{i}` of shape (batch, token, feature). The block
computes its whole branch f(x) = a + mlp(ln2(x + a)), a = attn(ln1(x)), and returns
x + gate ⊙ f(x). Every block runs for every token: the gate only reweights.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from exporters.backbone import MLP, Attention, Config, LanguageModel, Linear, rms_norm_noscale
from graphaudit.analyses.declared_coefficients import Coefficient


class Gate(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.proj = Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.proj(rms_norm_noscale(x)))


class GatedBlock(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.gate = Gate(cfg)
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, gate: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Return (block output, the gate computed here or None when it was given)."""
        computed = self.gate(x) if gate is None else None
        a = self.attn(self.ln1(x))
        branch = a + self.mlp(self.ln2(x + a))
        return x + (computed if gate is None else gate) * branch, computed


class FeatureGate(LanguageModel):
    name = "featuregate"

    def __init__(self, cfg: Config = Config()):
        super().__init__(cfg)
        self.blocks = nn.ModuleList(GatedBlock(cfg) for _ in range(cfg.n_layers))
        self._init_weights()
        for block in self.blocks:  # start mostly open (sigmoid(2) ≈ 0.88)
            nn.init.constant_(block.gate.proj.bias, 2.0)

    def coefficients(self) -> tuple[Coefficient, ...]:
        return tuple(
            Coefficient(f"gate.{i}", "gate", i, ("batch", "token", "feature"))
            for i in range(self.cfg.n_layers)
        )

    def forward(
        self, input_ids: Tensor, coefficients: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        given = self.overrides(coefficients)
        computed: dict[str, Tensor] = {}
        x = self.embedding(input_ids)
        for i, block in enumerate(self.blocks):
            x, gate = block(x, given.get(f"gate.{i}"))
            if gate is not None:
                computed[f"gate.{i}"] = gate
        return self.head(x), computed
