"""EarlyExit: after an early block, a confidence test decides whether the later blocks run.

The controller (`exit_test`) reads the hidden state after block `exit_after`: the model's
own final norm and head, softmax, and the highest probability at each token give
`exit.{exit_after}`, shape (batch, token). The decision is taken per batch, since an ONNX
`If` takes one scalar condition: the later blocks are skipped when every input's mean
confidence over its tokens exceeds `threshold`. For a single input that is a per-input
decision. `threshold` is a buffer, calibrated after training (see `calibrate_threshold`)
so that about half of the single calibration inputs exit early.

Exported with `torch.cond`, the decision becomes an ONNX `If` whose else-branch holds the
later blocks and whose then-branch passes the hidden state through; the head follows the
`If`. Training runs every block and adds the early head's loss (deep supervision), so the
early exit gives usable predictions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from exporters.backbone import Block, Config, LanguageModel, next_token_nll
from graphaudit.analyses.declared_coefficients import Coefficient


class ExitTest(nn.Module):
    """The controller: how sure the model's own head already is after the early block."""

    def forward(self, x: Tensor, head: Callable[[Tensor], Tensor]) -> Tensor:
        """Return the head's top probability at each token, (batch, token)."""
        return head(x).softmax(-1).amax(-1)


class EarlyExit(LanguageModel):
    name = "earlyexit"

    def __init__(self, cfg: Config = Config(), exit_after: int | None = None):
        super().__init__(cfg)
        # By default after the first half of the blocks (block 1 of four).
        exit_after = cfg.n_layers // 2 - 1 if exit_after is None else exit_after
        if not 0 <= exit_after < cfg.n_layers - 1:
            raise ValueError(
                f"expected exit_after in 0..{cfg.n_layers - 2} (some block after it to skip), "
                f"found {exit_after}"
            )
        self.exit_after = exit_after
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.exit_test = ExitTest()
        # Above any confidence until calibrated: an uncalibrated model never exits.
        self.register_buffer("threshold", torch.tensor(1.0))
        self._init_weights()

    @property
    def exit_name(self) -> str:
        return f"exit.{self.exit_after}"

    def coefficients(self) -> tuple[Coefficient, ...]:
        return (Coefficient(self.exit_name, "exit", self.exit_after, ("batch", "token")),)

    def trunk(self, input_ids: Tensor) -> Tensor:
        """Return the hidden state after block `exit_after` (the blocks that always run)."""
        x = self.embedding(input_ids)
        for block in self.blocks[: self.exit_after + 1]:
            x = block(x)
        return x

    def rest(self, x: Tensor) -> Tensor:
        """Return the hidden state after the blocks the exit can skip."""
        for block in self.blocks[self.exit_after + 1 :]:
            x = block(x)
        return x

    def confidence(self, x: Tensor) -> Tensor:
        """Return the controller's output `exit.{exit_after}` for hidden state x."""
        return self.exit_test(x, self.head)

    def exits(self, confidence: Tensor) -> Tensor:
        """Return the scalar decision: does every input of the batch exit early?"""
        return confidence.mean(-1).min() > self.threshold

    def forward(
        self, input_ids: Tensor, coefficients: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        given = self.overrides(coefficients)
        computed: dict[str, Tensor] = {}
        x = self.trunk(input_ids)
        if self.exit_name in given:
            confidence = given[self.exit_name]
        else:
            confidence = computed[self.exit_name] = self.confidence(x)
        exit_now = self.exits(confidence)
        if torch.compiler.is_exporting():
            x = torch.cond(exit_now, _skip, self.rest, (x,))
        elif not exit_now:  # eager: the same decision without compiling the branches
            x = self.rest(x)
        return self.head(x), computed

    def loss(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Final NLL plus the early head's NLL; every block runs while training."""
        x = self.trunk(input_ids)
        early = next_token_nll(self.head(x), input_ids)
        final = next_token_nll(self.head(self.rest(x)), input_ids)
        return final + early, final

    @torch.no_grad()
    def calibrate_threshold(self, input_ids: Tensor) -> Tensor:
        """Set the threshold to the median per-input confidence; return those confidences."""
        per_input = self.confidence(self.trunk(input_ids)).mean(-1)
        self.threshold.fill_(torch.quantile(per_input, 0.5).item())
        return per_input


def _skip(x: Tensor) -> Tensor:
    # A torch.cond branch may not return its operand itself (aliasing): a copy, which ONNX
    # Runtime runs as an Identity.
    return x.clone()
