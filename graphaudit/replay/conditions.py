"""Replay conditions: each maps the cached coefficients of some inputs to the array fed in.

Every condition is one small function `(c, rows) -> values`: for coefficient `c` and the
evaluation inputs at `rows`, the values to feed, batch axis first (see docs/design.md):

- `correct`: the inputs' own cached coefficients (must reproduce the live outputs);
- `cross_input`: those of input π(b), π a seeded derangement of the evaluation inputs (with
  padded inputs, a partner with tokens wherever b has them: `cross_partners`);
- `token_shuffle`: input b's own, with its positions permuted by a seeded σ_b (its tokens
  among themselves when the inputs are padded);
- `static_layer`: per layer and slot, the calibration mean over inputs and tokens;
- `static_position`: per layer, slot and position, the calibration mean over inputs;
- `global_mean`: per family, one calibration mean over every layer, slot, input and token.

Profiles come from the calibration cache only (padded positions left out); the evaluation
cache only supplies the coefficients that `correct`, `cross_input` and `token_shuffle` rearrange.

REGISTRY holds one `Condition` per name, in the order reports give them: its function and what
the rest of graphaudit needs to know of it (what it reads, whether it reassigns the inputs' own
coefficients, whether a retained gap is reported for it, what it feeds in words). The CLI's
choices, the replay, the verdict and the reports read it, so a new condition is one function
and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from graphaudit.errors import GraphAuditError, UsageError
from graphaudit.vocabulary import BATCH, MERGED, TOKEN

if TYPE_CHECKING:  # only named here: the verdict and the reports read this module without ONNX Runtime
    from graphaudit.analyses.declared_coefficients import Coefficient
    from graphaudit.replay.capture import CoefficientCache

# the conditions REGISTRY (at the end) holds, by name
CORRECT = "correct"  # the reference: reproduces the live outputs; always replayed, first
CROSS_INPUT, TOKEN_SHUFFLE = "cross_input", "token_shuffle"
STATIC_LAYER, STATIC_POSITION, FLOOR = "static_layer", "static_position", "global_mean"  # FLOOR: the gap's far end

Feed = Callable[["Coefficient", np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Profiles:
    """Calibration means: per layer and slot, per layer/slot/position, and per family."""

    layer: Mapping[str, np.ndarray]  # tensor -> batch-first, batch and token axes of size 1
    position: Mapping[str, np.ndarray]  # tensor -> batch-first, batch axis of size 1
    family: Mapping[str, float]
    count: int  # calibration inputs
    dtypes: Mapping[str, np.dtype] = field(default_factory=dict)  # tensor -> dtype of its values fed (float32 if absent)
    _filled: dict = field(default_factory=dict, repr=False, compare=False)

    def filled(self, kind: str, c: Coefficient, shape: tuple[int, ...], mean: Callable[[], np.ndarray]) -> np.ndarray:
        """The `kind` profile of `c` broadcast to `shape`: contiguous, read-only, made once per shape."""
        key = (kind, c.tensor, shape)
        if key not in self._filled:
            dtype = self.dtypes.get(c.tensor, np.dtype(np.float32))  # each tensor in its own type: models mix them
            values = mean()
            _check_fits(kind, c, values.shape, shape)
            full = np.ascontiguousarray(np.broadcast_to(_as(values, dtype), shape))
            full.flags.writeable = False
            self._filled[key] = full
        return self._filled[key]


PROFILE_NAMES = {"layer": STATIC_LAYER, "position": STATIC_POSITION, "global": FLOOR}


def _check_fits(kind: str, c: Coefficient, profile: tuple[int, ...], shape: tuple[int, ...]) -> None:
    """Refuse a calibration profile that cannot stand for the evaluation inputs' coefficients of
    `shape`: an axis besides the token axis whose size changes with the inputs (an attention-like
    map over positions, its `source` axis as long as the sequence)."""
    if len(profile) < len(shape) or all(p in (1, n) for p, n in zip(profile, shape)):
        return  # fewer axes: one family mean, a scalar
    names = batch_first_axes(c)
    differ = [f"{names[i] if i < len(names) else i} ({p} in calibration, {n} in evaluation)"
              for i, (p, n) in enumerate(zip(profile, shape)) if p not in (1, n)]
    raise GraphAuditError(
        f"expected {PROFILE_NAMES.get(kind, kind)}'s profile of {c.tensor!r} to fit the evaluation inputs' "
        f"coefficients of shape {shape[1:]} per batch, found one of shape {profile[1:]} from calibration: "
        f"{'axis' if len(differ) == 1 else 'axes'} {', '.join(differ)} "
        f"{'changes' if len(differ) == 1 else 'change'} with the inputs' length besides the token axis; "
        "calibrate on inputs as long as the evaluation inputs")


def batch_first_axes(c: Coefficient) -> tuple[str, ...]:
    """`c`'s axis names once its batch axis is moved to the front."""
    if BATCH not in c.axes:
        return tuple(c.axes)
    return (BATCH, *(a for i, a in enumerate(c.axes) if i != c.axis(BATCH)))


def _as(mean: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A mean in the coefficient's own type: an integer one (a quantized coefficient's codes)
    rounded to the nearest value the type holds, not cut towards zero."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.clip(np.rint(mean), info.min, info.max).astype(dtype)
    return mean.astype(dtype)


def token_axis(c: Coefficient) -> int | None:
    """Position of `c`'s token axis once its batch axis is moved to the front."""
    if MERGED in c.axes:
        return 1  # split right after the batch
    t = c.axis(TOKEN)
    if t is None:
        return None
    from graphaudit.replay.capture import batch_axis  # here: the CLI reads the registry without loading onnx

    return t + 1 if t < batch_axis(c) else t


def token_weights(c: Coefficient, shape: tuple[int, ...], tokens: np.ndarray | None, rows) -> np.ndarray | None:
    """1 where the inputs at `rows` have a token and 0 where they are padded, shaped to broadcast
    over `c`'s batch-first values of `shape`; None when nothing is padded, or `c` has no token
    axis as long as the inputs (its positions are not theirs)."""
    t = token_axis(c)
    if tokens is None or t is None or shape[t] != tokens.shape[1]:
        return None
    picked = tokens[rows].astype(np.float64)
    return picked.reshape(picked.shape[0], *[picked.shape[1] if i == t else 1 for i in range(1, len(shape))])


def profiles(calib: CoefficientCache, chunk: int = 64, tokens: np.ndarray | None = None) -> Profiles:
    """Return the calibration profiles, streaming over the cache `chunk` inputs at a time.
    `tokens`: (inputs, positions), False where an input is padded; padded positions are left out."""
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, np.ndarray] = {}  # values summed at each position: inputs, less the padded
    for rows, values in calib.chunks(chunk):
        for c in calib.coefficients:
            v, w = values[c.tensor], token_weights(c, calib.shape(c), tokens, rows)
            part = (v if w is None else v * w).sum(axis=0, keepdims=True, dtype=np.float64)
            sums[c.tensor] = sums[c.tensor] + part if c.tensor in sums else part
            if w is not None:
                n = w.sum(axis=0, keepdims=True)
                counts[c.tensor] = counts[c.tensor] + n if c.tensor in counts else n
    layer, position = {}, {}
    family_sum: dict[str, float] = {}
    family_count: dict[str, float] = {}
    for c in calib.coefficients:
        t, total = token_axis(c), sums[c.tensor]
        if c.tensor not in counts:
            position[c.tensor] = total / calib.count
            layer[c.tensor] = position[c.tensor] if t is None else position[c.tensor].mean(axis=t, keepdims=True)
            family_count[c.family] = family_count.get(c.family, 0) + int(np.prod(calib.shape(c)))
        else:
            n = counts[c.tensor]
            assert t is not None, "token_weights weighs only a coefficient with a token axis"
            layer[c.tensor] = total.sum(axis=t, keepdims=True) / n.sum(axis=t, keepdims=True)
            with np.errstate(invalid="ignore", divide="ignore"):  # a position every input pads: its layer mean
                position[c.tensor] = np.where(n > 0, total / n, layer[c.tensor])
            slots = total.size // total.shape[t]
            family_count[c.family] = family_count.get(c.family, 0) + float(n.sum()) * slots
        family_sum[c.family] = family_sum.get(c.family, 0.0) + float(total.sum())
    family = {f: family_sum[f] / family_count[f] for f in family_sum}
    dtypes = {c.tensor: calib.arrays[c.tensor].dtype for c in calib.coefficients}
    return Profiles(layer, position, family, calib.count, dtypes)


@dataclass(frozen=True)
class Drawn:
    """What the conditions' values are made from, drawn once per replay from its seed."""

    evaluation: CoefficientCache  # the evaluation inputs' own coefficients
    partner: np.ndarray | None = None  # cross_input's partner of each input
    orders: dict[int, np.ndarray] | None = None  # token_shuffle's order of each input's positions, by length
    profiles: Profiles | None = None  # the calibration means


def _profiles(d: Drawn) -> Profiles:
    """The calibration profiles, which `conditions` draws for every CALIBRATION condition."""
    assert d.profiles is not None, "conditions() draws the profiles for a CALIBRATION condition"
    return d.profiles


def correct(d: Drawn, c: Coefficient, rows: np.ndarray) -> np.ndarray:
    """The inputs' own cached coefficients."""
    return d.evaluation.rows(c, rows)


def cross_input(d: Drawn, c: Coefficient, rows: np.ndarray) -> np.ndarray:
    """The coefficients of each input's partner."""
    assert d.partner is not None, "conditions() draws partners for a PARTNERS condition"
    return d.evaluation.rows(c, d.partner[rows])


def token_shuffle(d: Drawn, c: Coefficient, rows: np.ndarray) -> np.ndarray:
    """`c`'s values with each input's positions in its order σ_b (`d.orders`: by token length)."""
    values, t = d.evaluation.rows(c, rows), token_axis(c)
    if t is None:
        return values
    assert d.orders is not None, "conditions() draws orders for an ORDERS condition"
    order = d.orders[values.shape[t]]
    # as lines: (input, axes before t, position) → the values after t; input b's lines in the order σ_b
    count, length = values.shape[0], values.shape[t]
    before = int(np.prod(values.shape[1:t], dtype=np.int64))
    lines = values.reshape(count * before * length, -1)
    first = np.arange(count * before, dtype=np.int64).reshape(count, before, 1) * length
    return np.take(lines, (first + order[rows][:, None, :]).ravel(), axis=0).reshape(values.shape)


def static_layer(d: Drawn, c: Coefficient, rows: np.ndarray) -> np.ndarray:
    """The calibration mean of `c` over inputs and tokens."""
    prof = _profiles(d)
    return prof.filled("layer", c, (len(rows), *d.evaluation.shape(c)[1:]), lambda: prof.layer[c.tensor])


def static_position(d: Drawn, c: Coefficient, rows: np.ndarray) -> np.ndarray:
    """The calibration mean of `c` over inputs, at each position."""
    prof, t = _profiles(d), token_axis(c)
    mean, size = prof.position[c.tensor], d.evaluation.shape(c)
    if t is not None and mean.shape[t] < size[t]:
        raise GraphAuditError(
            f"expected calibration inputs at least as long as the evaluation inputs for static_position, "
            f"found {mean.shape[t]} positions for {c.tensor!r} against {size[t]}"
        )
    shape = (len(rows), *size[1:])
    return prof.filled("position", c, shape, lambda: mean if t is None else np.take(mean, range(shape[t]), axis=t))


def global_mean(d: Drawn, c: Coefficient, rows: np.ndarray) -> np.ndarray:
    """The calibration mean of `c`'s family over every layer, slot, input and token."""
    prof = _profiles(d)
    return prof.filled("global", c, (len(rows), *d.evaluation.shape(c)[1:]), lambda: np.asarray(prof.family[c.family]))


# What a condition's values are made from (Condition.reads): what `conditions` must draw for it.
OWN, PARTNERS, ORDERS, CALIBRATION = "own", "partners", "orders", "calibration"


@dataclass(frozen=True)
class Condition:
    """A replay condition: its name, the function that makes its values, and what it is."""

    name: str
    feed: Callable[[Drawn, Coefficient, np.ndarray], np.ndarray]  # (drawn, c, rows) -> the values, batch first
    reads: str  # OWN (coefficients), PARTNERS, ORDERS or CALIBRATION (the calibration profiles)
    words: str  # what it feeds the frozen model, in a few words
    reassigns: bool = False  # the inputs' own coefficients rearranged: does the model depend on which it gets?
    retained_gap: bool = False  # a static profile: the report gives the share of the floor's gap it keeps
    without_tokens: str | None = None  # needs a token axis; without one it would feed this, and is left out


REGISTRY: dict[str, Condition] = {c.name: c for c in (
    Condition(CORRECT, correct, OWN, "its own coefficients"),
    Condition(CROSS_INPUT, cross_input, PARTNERS, "another input's coefficients", reassigns=True),
    Condition(TOKEN_SHUFFLE, token_shuffle, ORDERS, "its own shuffled over tokens", reassigns=True,
              without_tokens="the correct ones"),
    Condition(STATIC_LAYER, static_layer, CALIBRATION, "a calibration mean per layer and slot", retained_gap=True),
    Condition(STATIC_POSITION, static_position, CALIBRATION, "a calibration mean per layer, slot and position",
              retained_gap=True, without_tokens="the static_layer profile"),
    Condition(FLOOR, global_mean, CALIBRATION, "one calibration mean per family"),
)}


def names() -> tuple[str, ...]:
    """Every condition's name, in the registry's order (the default: all of them)."""
    return tuple(REGISTRY)


def reassignments() -> tuple[str, ...]:
    """The conditions that feed the inputs' own coefficients rearranged, in the registry's order."""
    return tuple(n for n, c in REGISTRY.items() if c.reassigns)


def gap_profiles() -> tuple[str, ...]:
    """The static profiles whose retained gap the replay reports, in the registry's order."""
    return tuple(n for n, c in REGISTRY.items() if c.retained_gap)


def check_names(given: Sequence[str], what: str = "conditions") -> None:
    """Raise UsageError naming the conditions among `given` that the registry does not hold."""
    unknown = [n for n in given if n not in REGISTRY]
    if unknown:
        raise UsageError(f"expected {what} among {', '.join(REGISTRY)}, found {', '.join(unknown)}")


def derangement(count: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly drawn permutation of range(count) with no fixed point."""
    if count < 2:
        raise GraphAuditError(f"expected at least 2 evaluation inputs for cross_input, found {count}")
    while True:
        perm = rng.permutation(count)
        if not np.any(perm == np.arange(count)):
            return perm


def cross_partners(drawn: np.ndarray, tokens: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, str | None]:
    """cross_input's partner of every input when inputs are padded: the derangement `drawn`,
    except where the drawn partner has padding at one of the input's tokens (it is shorter, as
    docs/design.md's "equal lengths" rules out): there, an input drawn at random among those with
    tokens wherever this one has them, else among those that share most of its tokens. Returns
    the partners and a note of what was changed (None: nothing). Partners may then repeat."""
    masks, group = np.unique(tokens, axis=0, return_inverse=True)
    group = group.reshape(-1)
    counts = masks.sum(axis=1)
    members = [np.flatnonzero(group == g) for g in range(len(masks))]
    partner = drawn.copy()
    shared: dict[int, np.ndarray] = {}  # group -> tokens each group shares with it
    moved = short = missed = 0
    for b in range(len(drawn)):
        g = group[b]
        if g not in shared:
            shared[g] = masks.astype(np.int64) @ masks[g].astype(np.int64)
        if shared[g][group[drawn[b]]] == counts[g]:
            continue
        # the inputs that cover this one's tokens (its own group among them), else those sharing most
        for level in sorted(set(shared[g].tolist()), reverse=True):
            candidates = np.concatenate([members[h] for h in np.flatnonzero(shared[g] == level)])
            candidates = candidates[candidates != b]
            if len(candidates):
                break
        partner[b] = rng.choice(candidates)
        moved += 1
        if level < counts[g]:
            short += 1
            missed += int(counts[g] - level)
    if not moved:
        return partner, None
    note = (f"cross_input gave {moved} of {len(drawn)} inputs another partner, one with tokens wherever they "
            "have them (a shorter partner's padding would have reached their tokens)")
    if short:
        note += f"; {missed} tokens of {short} inputs that no other input covers still met a partner's padding"
    return partner, note


def position_orders(count: int, length: int, rng: np.random.Generator, tokens: np.ndarray | None = None) -> np.ndarray:
    """One random permutation of `length` positions per input, shape (count, length); given
    `tokens` (count, length), each input's tokens are permuted among themselves and its padded
    positions stay where they are."""
    if tokens is None or tokens.shape != (count, length):
        return rng.permuted(np.tile(np.arange(length, dtype=np.int64), (count, 1)), axis=1)
    orders = np.tile(np.arange(length, dtype=np.int64), (count, 1))
    for b in range(count):
        kept = np.flatnonzero(tokens[b])
        orders[b, kept] = rng.permutation(kept)
    return orders


def conditions(
    names: Sequence[str], evaluation: CoefficientCache, calibration: CoefficientCache, seed: int,
    tokens: tuple[np.ndarray | None, np.ndarray | None] = (None, None), notes: dict[str, str] | None = None,
) -> dict[str, Feed]:
    """Return {condition: feed} for `names`, `correct` first; permutations drawn from `seed`.
    `tokens`: where the evaluation and the calibration inputs have tokens (`data.padding`):
    cross_input's partners have tokens wherever their input has, token_shuffle permutes an
    input's tokens only, and the profiles leave padded positions out. What that changed is
    written in `notes`, by condition."""
    check_names(names)
    reads = {REGISTRY[n].reads for n in names}
    rng = np.random.default_rng(seed)
    # drawn whether cross_input runs or not, so that a seed gives token_shuffle the same orders either way
    drawn = derangement(evaluation.count, rng) if PARTNERS in reads or evaluation.count >= 2 else None
    partner = drawn if PARTNERS in reads else None
    if partner is not None and tokens[0] is not None:
        partner, note = cross_partners(partner, tokens[0], np.random.default_rng([seed, 1]))  # apart from the orders
        if note and notes is not None:
            notes[CROSS_INPUT] = note
    lengths = {evaluation.shape(c)[t] for c in evaluation.coefficients if (t := token_axis(c)) is not None}
    orders = None
    if ORDERS in reads:
        # the inputs' own positions: one order each, of their tokens only; coefficients with fewer
        # positions (those a pruning step kept) get orders of their own, from the same seed
        longest = max(lengths, default=1)
        orders = {longest: position_orders(evaluation.count, longest, rng, tokens[0])}
        orders.update({n: position_orders(evaluation.count, n, np.random.default_rng([seed, 2, n]))
                       for n in lengths if n != longest})
    prof = profiles(calibration, tokens=tokens[1]) if CALIBRATION in reads else None
    sources = Drawn(evaluation, partner, orders, prof)
    ordered = [CORRECT, *(n for n in dict.fromkeys(names) if n != CORRECT)]
    return {n: partial(REGISTRY[n].feed, sources) for n in ordered}
