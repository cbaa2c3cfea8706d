"""The pieces every zoo model shares: configuration, attention, MLP, the Dense decoder.

A byte-level causal language model: `input_ids` (batch, seq) int64 → `logits`
(batch, seq, 256). Pre-norm GPT blocks, learned positions, a separate (untied) head.
Modules are named `blocks.{i}` so that the exported graph's name scopes and initializer
names say which layer every node belongs to.

Every zoo model has the same call: `model(input_ids, coefficients=None)` gives back
`(logits, computed)`, where `computed` maps each coefficient tensor name (`gate.0`, …) to
the tensor the controller produced. A name present in `coefficients` replaces the
controller's output for that tensor; the controller is then not run, and the name is
absent from `computed`. The frozen ONNX graph is the export of that call with every name
given.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graphaudit.analyses.declared_coefficients import Coefficient


@dataclass(frozen=True)
class Config:
    """Sizes shared by the whole zoo (one tokenizer, one width, one depth)."""

    vocab: int = 256
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 128
    context: int = 64

    def to_json(self) -> dict:
        return asdict(self)


class Linear(nn.Module):
    """y = x @ weight + bias, with weight stored (in, out).

    Stored the way ONNX MatMul reads it, so the exporter needs no Transpose that its
    constant folding would turn into an anonymous initializer: the file keeps the
    parameter names (`blocks.2.attn.q.weight`).
    """

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        y = x @ self.weight
        return y if self.bias is None else y + self.bias


def rms_norm_noscale(x: Tensor, eps: float = 1e-6) -> Tensor:
    """Return x scaled to unit root-mean-square over its last axis (no learned weight)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class Attention(nn.Module):
    """Causal multi-head self-attention; q, k and v may come from different streams."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.q = Linear(cfg.d_model, cfg.d_model)
        self.k = Linear(cfg.d_model, cfg.d_model)
        self.v = Linear(cfg.d_model, cfg.d_model)
        self.o = Linear(cfg.d_model, cfg.d_model)

    def forward(self, xq: Tensor, xk: Tensor | None = None, xv: Tensor | None = None) -> Tensor:
        xk = xq if xk is None else xk
        xv = xq if xv is None else xv
        b, t, d = xq.shape
        h = self.n_heads

        def heads(y: Tensor) -> Tensor:
            return y.reshape(b, t, h, d // h).transpose(1, 2)

        q, k, v = heads(self.q(xq)), heads(self.k(xk)), heads(self.v(xv))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)
        future = torch.ones(t, t, dtype=torch.bool, device=xq.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        y = scores.softmax(-1) @ v
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.up = Linear(cfg.d_model, cfg.d_ff)
        self.down = Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(ln1 x), then + mlp(ln2 x)."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class LanguageModel(nn.Module):
    """Embedding, positions, final norm and head; subclasses supply the blocks."""

    name = "base"

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(cfg.context, cfg.d_model))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.lm_head = Linear(cfg.d_model, cfg.vocab, bias=False)

    def _init_weights(self) -> None:
        """GPT-2 style initialisation; called by subclasses once their modules exist."""
        for module in self.modules():
            if isinstance(module, (Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.01)

    def embedding(self, input_ids: Tensor) -> Tensor:
        t = input_ids.shape[1]
        return self.embed(input_ids) + self.pos[:t]

    def head(self, x: Tensor) -> Tensor:
        return self.lm_head(self.norm(x))

    def coefficients(self) -> tuple[Coefficient, ...]:
        """Return the coefficient tensors this model declares (none for Dense)."""
        return ()

    def overrides(self, coefficients: dict[str, Tensor] | None) -> dict[str, Tensor]:
        """Return the given coefficient overrides, refusing names the model does not have."""
        coefficients = dict(coefficients or {})
        unknown = set(coefficients) - {c.tensor for c in self.coefficients()}
        if unknown:
            raise KeyError(f"{self.name} has no coefficient tensor named {sorted(unknown)}")
        return coefficients

    def loss(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Return (training loss, next-token NLL in nats) on a batch of token windows."""
        logits, _ = self(input_ids)
        nll = next_token_nll(logits, input_ids)
        return nll, nll


def next_token_nll(logits: Tensor, input_ids: Tensor) -> Tensor:
    """Return the mean cross-entropy (nats) of predicting input_ids[:, 1:] from logits[:, :-1]."""
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1)
    )


class Dense(LanguageModel):
    """The baseline: a plain pre-norm GPT decoder with no controller."""

    name = "dense"

    def __init__(self, cfg: Config = Config()):
        super().__init__(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self._init_weights()

    def forward(
        self, input_ids: Tensor, coefficients: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        self.overrides(coefficients)
        x = self.embedding(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x), {}
