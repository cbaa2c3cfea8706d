"""MUDD: multiway dynamic dense connections, after MUDDFormer (see shared/reference/mudd.md).

After block i a controller (`blocks.{i}.mudd`: RMS-norm without scale → Linear → GELU →
Linear, plus a learned static bias) reads the block's raw output and produces `mudd.{i}`,
shape (C_i, batch, token, i+2): weights that mix the embedding and every block output so
far into C_i streams. C = 4 (q, k, v, residual) for every layer but the last, which has
C = 1 (the residual, fed to the head). Blocks after the first read the four streams:
attention takes q, k, v from their own LayerNorms and is added to the residual stream,
and the FFN reads the residual stream in parallel. Every block runs for every token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from exporters.backbone import MLP, Attention, Config, LanguageModel, Linear, rms_norm_noscale
from graphaudit.analyses.declared_coefficients import Coefficient

WAYS = 4  # q, k, v, residual


class DenseController(nn.Module):
    """Mixing weights (C, batch, token, sources) for the streams after one block."""

    def __init__(self, cfg: Config, ways: int, sources: int, last: bool):
        super().__init__()
        self.ways, self.sources = ways, sources
        hidden = (ways * sources * (4 if last else 1) // 64 + 1) * 64
        self.w1 = Linear(cfg.d_model, hidden, bias=False)
        self.w2 = Linear(hidden, ways * sources, bias=False)
        # Static part, stored (C, 1, 1, L) to broadcast over batch and token. It starts as a
        # plain residual stream: all weight on the newest output.
        bias = torch.zeros(ways, 1, 1, sources)
        bias[..., -1] = 1.0
        self.bias = nn.Parameter(bias)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        dw = self.w2(F.gelu(self.w1(rms_norm_noscale(x))))  # feature index c·L + j
        dw = dw.reshape(b, t, self.ways, self.sources).permute(2, 0, 1, 3)
        return dw + self.bias


class MuddBlock(nn.Module):
    def __init__(self, cfg: Config, index: int):
        super().__init__()
        last = index == cfg.n_layers - 1
        self.ln_q = nn.LayerNorm(cfg.d_model)
        self.ln_k = nn.LayerNorm(cfg.d_model)
        self.ln_v = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln_m = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.mudd = DenseController(cfg, 1 if last else WAYS, index + 2, last)

    def forward(self, xq: Tensor, xk: Tensor, xv: Tensor, xr: Tensor) -> Tensor:
        a = self.attn(self.ln_q(xq), self.ln_k(xk), self.ln_v(xv))
        return xr + a + self.mlp(self.ln_m(xr))


class MUDD(LanguageModel):
    name = "mudd"

    def __init__(self, cfg: Config = Config()):
        super().__init__(cfg)
        self.blocks = nn.ModuleList(MuddBlock(cfg, i) for i in range(cfg.n_layers))
        self._init_weights()
        for block in self.blocks:  # the dynamic part starts at zero, as in MUDDFormer
            nn.init.zeros_(block.mudd.w2.weight)

    def coefficients(self) -> tuple[Coefficient, ...]:
        return tuple(
            Coefficient(f"mudd.{i}", "mudd", i, ("way", "batch", "token", "source"))
            for i in range(self.cfg.n_layers)
        )

    def forward(
        self, input_ids: Tensor, coefficients: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        given = self.overrides(coefficients)
        computed: dict[str, Tensor] = {}
        x = self.embedding(input_ids)
        hids = [x]
        streams = [x] * WAYS
        for i, block in enumerate(self.blocks):
            x = block(*streams)
            hids.append(x)
            name = f"mudd.{i}"
            if name in given:
                dw = given[name]
            else:
                dw = computed[name] = block.mudd(x)
            mixed = torch.einsum("cbtl,lbtd->cbtd", dw, torch.stack(hids))
            streams = list(mixed.unbind(0))
        return self.head(streams[0]), computed
