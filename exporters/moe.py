"""MoE: the FFN of some layers is a set of experts, each token routed to its top-k.

Router of block i (`blocks.{i}.router`): Linear(d, E) of the FFN's input → softmax, giving
`router.{i}` of shape (batch, token, expert). The top-k experts of each token get weights
renormalised to sum to one. Dispatch is real: for every expert, `nonzero` finds the tokens
routed to it, only those rows go through it (index_select), and the results are added back
in place (index_add). The exported graph holds TopK, NonZero, Gather and ScatterND/Elements
with data-dependent sizes, so the experts' compute depends on the routing.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from exporters.backbone import MLP, Attention, Block, Config, LanguageModel, Linear, next_token_nll
from graphaudit.analyses.declared_coefficients import Coefficient

N_EXPERTS = 4
TOP_K = 2
BALANCE_WEIGHT = 0.01


class Router(nn.Module):
    def __init__(self, cfg: Config, n_experts: int):
        super().__init__()
        self.proj = Linear(cfg.d_model, n_experts, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).softmax(-1)


class Experts(nn.Module):
    """Top-k routed experts with token dispatch (gather → expert → scatter-add)."""

    def __init__(self, cfg: Config, n_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.experts = nn.ModuleList(MLP(cfg) for _ in range(n_experts))

    def forward(self, x: Tensor, probs: Tensor) -> Tensor:
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        weight, chosen = probs.reshape(b * t, -1).topk(self.top_k, dim=-1)
        weight = weight / weight.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.nonzero(chosen == e, as_tuple=True)
            y = expert(flat.index_select(0, token)) * weight[token, slot].unsqueeze(-1)
            out = out.index_add(0, token, y)
        return out.reshape(b, t, d)


class MoEBlock(nn.Module):
    def __init__(self, cfg: Config, n_experts: int, top_k: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.router = Router(cfg, n_experts)
        self.ffn = Experts(cfg, n_experts, top_k)

    def forward(self, x: Tensor, probs: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Return (block output, the router's probabilities or None when they were given)."""
        x = x + self.attn(self.ln1(x))
        h = self.ln2(x)
        computed = self.router(h) if probs is None else None
        return x + self.ffn(h, computed if probs is None else probs), computed


class MoE(LanguageModel):
    name = "moe"

    def __init__(
        self,
        cfg: Config = Config(),
        n_experts: int = N_EXPERTS,
        top_k: int = TOP_K,
        moe_layers: tuple[int, ...] | None = None,
    ):
        super().__init__(cfg)
        # By default every other layer, starting at 1 (layers 1 and 3 of four).
        self.moe_layers = tuple(range(1, cfg.n_layers, 2) if moe_layers is None else moe_layers)
        self.n_experts, self.top_k = n_experts, top_k
        self.blocks = nn.ModuleList(
            MoEBlock(cfg, n_experts, top_k) if i in self.moe_layers else Block(cfg)
            for i in range(cfg.n_layers)
        )
        self._init_weights()

    def coefficients(self) -> tuple[Coefficient, ...]:
        return tuple(
            Coefficient(f"router.{i}", "router", i, ("batch", "token", "expert"))
            for i in self.moe_layers
        )

    def forward(
        self, input_ids: Tensor, coefficients: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        given = self.overrides(coefficients)
        computed: dict[str, Tensor] = {}
        x = self.embedding(input_ids)
        for i, block in enumerate(self.blocks):
            if i not in self.moe_layers:
                x = block(x)
                continue
            x, probs = block(x, given.get(f"router.{i}"))
            if probs is not None:
                computed[f"router.{i}"] = probs
        return self.head(x), computed

    def loss(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        """NLL plus the Switch-Transformer load-balancing term (keeps every expert in use)."""
        logits, computed = self(input_ids)
        nll = next_token_nll(logits, input_ids)
        balance = logits.new_zeros(())
        for probs in computed.values():
            probs = probs.reshape(-1, self.n_experts)
            chosen = probs.topk(self.top_k, dim=-1).indices
            share = torch.zeros_like(probs).scatter(1, chosen, 1.0).mean(0)
            balance = balance + self.n_experts * (share * probs.mean(0)).sum()
        return nll + BALANCE_WEIGHT * balance, nll
