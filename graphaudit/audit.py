"""`audit`: the three-property audit of one model, and its verdict.

It runs, in the order of the data flow, what applies to the model:

1. the static audit of the graph (always): blocks, their execution verdicts, coefficients;
2. the frozen-controller replay, when the model has coefficient tensors (declared in its
   metadata or named with `coefficients`); without any it does not run, and says so;
3. the runtime profile on the evaluation inputs (the calibration inputs when none are
   given), timed in alternation with the baseline when one is given;

then the verdict (graphaudit.verdict.decide), a pure function of the three parts' JSON. The
AuditReport keeps the parts' own report objects; `to_json()` is the versioned document
every renderer reads (see graphaudit/report/schema.json).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphaudit._version import __version__
from graphaudit.errors import GraphAuditError, UsageError
from graphaudit.profile.settings import SAVINGS_RATIO_MAX
from graphaudit.progress import Progress, silent
from graphaudit.report.jsondoc import SCHEMA_VERSION, plain
from graphaudit.verdict.decide import CLAIM_FINDINGS, ClaimCheck, Verdict, check_claim, decide
from graphaudit.wording import counted

if TYPE_CHECKING:
    from graphaudit.load.data import InputData
    from graphaudit.load.model import LoadedModel
    from graphaudit.profile.settings import ProfileSettings
    from graphaudit.replay.settings import ReplaySettings

# Importing this module stays light (no numpy, onnx or runtime): `graphaudit/__init__.py`
# re-exports `audit` from it. Everything heavy is imported where the audit runs.

ZOO = ("dense", "featuregate", "mudd", "moe", "earlyexit")


@dataclass(frozen=True)
class AuditReport:
    """The three parts' reports (None where a part did not run), the verdict and notes."""

    model: str
    inputs: dict
    static: Any | None  # graphaudit.analyses.static.StaticReport
    replay: Any | None  # graphaudit.replay.results.ReplayReport
    profile: Any | None  # graphaudit.profile.ProfileReport
    verdict: Verdict
    notes: tuple[str, ...] = ()
    claims: tuple[ClaimCheck, ...] = ()
    baseline_flops: float | None = None  # the baseline graph's FLOPs per input, at the profiled shape
    timing: dict = field(default_factory=dict)  # seconds per phase (load_s, static_s, replay_s, profile_s, total_s)
    _parts: dict = field(default_factory=dict, repr=False, compare=False)

    def check(self, claim: str) -> ClaimCheck:
        """Whether this audit supports `claim` (dynamic-inference or compute-savings)."""
        return check_claim(self.verdict, claim)

    def to_json(self) -> dict:
        """The audit as the versioned JSON document (schema: graphaudit/report/schema.json)."""
        doc: dict[str, Any] = {
            "version": SCHEMA_VERSION,
            "graphaudit_version": __version__,
            "model": self.model,
            "inputs": dict(self.inputs),
            "notes": list(self.notes),
            **{name: self._parts.get(name) for name in ("static", "replay", "profile")},
            "baseline_flops": self.baseline_flops,
            "verdict": self.verdict.to_json(),
            "claims": [c.to_json() for c in self.claims],
            "timing": dict(self.timing),
        }
        means = (doc["replay"] or {}).get("coefficient_means")
        if means:
            doc["coefficient_means"] = means
        return plain(doc)

    def render(self, fmt: str = "text") -> str:
        """The report as text, json, markdown or html."""
        from graphaudit.report import render

        return render(self.to_json(), fmt)


@dataclass(frozen=True)
class AuditSettings:
    """What `audit` is asked: the replay's settings, the profile's, and the claims to check.

    The static audit reads the replay's coefficient names and feeding, and the profile's block
    pattern. `AuditSettings.of(**options)` builds one from `audit`'s keywords.
    """

    replay: ReplaySettings = field(default_factory=lambda: _replay_settings()(provider="auto"))
    # the audit asks the profile for the compute-savings answer: its timed rounds stop once it is decided
    profile: ProfileSettings = field(default_factory=lambda: _profile_settings()(provider="auto",
                                                                                 decide_at=SAVINGS_RATIO_MAX))
    claims: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "claims", tuple(self.claims))

    @classmethod
    def of(cls, settings: AuditSettings | None = None, **options: Any) -> AuditSettings:
        """`settings` (default: the defaults) with `audit`'s keywords in `options` applied: each goes to
        the part it names (`_KEYWORDS`), and `provider`, `threads` and `feeding` to both parts."""
        base = settings if settings is not None else cls()
        parts: dict[str, dict[str, Any]] = {"replay": {}, "profile": {}}
        claims = options.pop("claims", base.claims)
        for name, value in options.items():
            homes = _KEYWORDS.get(name)
            if homes is None:
                raise TypeError(f"audit() got an unexpected keyword argument {name!r}")
            if name == "profile_budget" and value is None:  # the profile's default
                continue
            for part, attr in homes:
                parts[part][attr] = value
        return cls(replay=replace(base.replay, **parts["replay"]), profile=replace(base.profile, **parts["profile"]),
                   claims=claims)


# audit's keyword -> the settings fields it sets, as (part, field)
_KEYWORDS = {
    "coefficients": (("replay", "coefficients"),), "seed": (("replay", "seed"),),
    "batch_size": (("replay", "batch_size"),), "resamples": (("replay", "resamples"),),
    "flush_denormals": (("replay", "flush_denormals"),), "rewrite": (("replay", "rewrite"),),
    "output_kinds": (("replay", "output_kinds"),),
    "block_pattern": (("profile", "block_pattern"),), "runs": (("profile", "runs"),),
    "warmup": (("profile", "warmup"),), "profile_runs": (("profile", "profile_runs"),),
    "profile_budget": (("profile", "budget"),), "profile_limit": (("profile", "limit"),),
    "profile_precision": (("profile", "precision"),), "profile_sample": (("profile", "sample"),),
    "profile_decide_at": (("profile", "decide_at"),),
    **{name: (("replay", name), ("profile", name)) for name in ("provider", "threads", "feeding")},
}


def _replay_settings():
    from graphaudit.replay.settings import ReplaySettings

    return ReplaySettings


def _profile_settings():
    from graphaudit.profile.settings import ProfileSettings

    return ProfileSettings


def audit(
    model: str | os.PathLike | LoadedModel,
    calib: str | os.PathLike | InputData,
    data: str | os.PathLike | InputData | None = None,
    baseline: str | os.PathLike | LoadedModel | None = None,
    settings: AuditSettings | None = None,
    *,
    progress: Progress | None = None,
    **options: Any,
) -> AuditReport:
    """Return the AuditReport of `model`: static audit, frozen replay, runtime profile, verdict.

    `calib` calibrates the static profiles of the replay; `data` is replayed and profiled
    (without it the replay splits `calib` into disjoint halves and the profile runs on
    `calib`). `baseline` is a dense model taking the same inputs. `settings` (an AuditSettings)
    says how, handed whole to each part; keywords `options` set it field by field, as
    `AuditSettings.of` reads them:

    `coefficients` (names or globs), `seed`, `batch_size`, `resamples`, `flush_denormals`,
    `rewrite` and `output_kinds` are the replay's (see `replay`); `batch_size` None: 16, or 1
    when the graph has value-dependent control flow (an If or Loop decides once per batch, so
    batching would mix inputs' decisions). `runs`, `warmup` and `profile_runs` are the
    profiler's rounds, `profile_sample` the inputs it runs on (None: chosen from measured times
    to fit `profile_budget` seconds, by default 30, the timed rounds stopping once the latency's
    interval is within `profile_precision`, by default ±2%, or once the compute-savings answer on
    the ratio `profile_decide_at` is decided, by default 0.95, None: only at the precision);
    `profile_limit` profiles only the first N inputs; `block_pattern` names the blocks, for the
    static audit and the profile. `provider` (default auto), `threads` (ONNX Runtime's intra-op
    threads; None: its choice) and `feeding` (values fed whole to every batch and inputs batched
    on an axis of their own: graphaudit.load.feeding) go to every part.
    `claims`: the claims to check (see `check_claim`).
    """
    if settings is not None and not isinstance(settings, AuditSettings):
        raise TypeError(f"expected an AuditSettings as audit()'s fifth argument, found {type(settings).__name__}: "
                        "give coefficients= and provider= by name")
    settings = AuditSettings.of(settings, **options)
    asked, claims = settings.replay, settings.claims
    coefficients, provider, feeding, block_pattern = asked.coefficients, asked.provider, asked.feeding, \
        settings.profile.block_pattern
    for claim in claims:
        if claim not in CLAIM_FINDINGS:
            raise UsageError(f"expected a claim among {', '.join(CLAIM_FINDINGS)}, found {claim!r}")
    if "compute-savings" in claims and baseline is None:
        raise UsageError("expected --baseline with --claim compute-savings: a saving is measured against a baseline")
    from graphaudit.load.model import load_for_runtime
    from graphaudit.profile.rounds import check_rounds
    from graphaudit.replay.surgery import UnfreezableError
    from graphaudit.runtime.sessions import FrozenRunError, usable_threads

    threads, capped = usable_threads(asked.threads)  # before anything runs
    check_rounds(1, settings.profile.runs, settings.profile.warmup, settings.profile.profile_runs,
                 settings.profile.sample)

    report = progress or silent
    clock = _Clock()
    loaded = load_for_runtime(model)
    clock.lap("load_s")
    if asked.output_kinds:  # a name or kind given wrong: before anything runs
        from graphaudit.analyses.output_kinds import read_outputs

        read_outputs(loaded.model, asked.output_kinds)
    notes: list[str] = [capped] if capped else []
    is_baseline = _same_file(model, baseline)
    if is_baseline:
        baseline = None
        notes.append("the model is its own baseline: it was not timed against itself")
    if loaded.inlined_calls:
        notes.append(f"{counted(loaded.inlined_calls, 'call')} of local functions ({', '.join(loaded.inlined_functions)}) "
                     "were inlined at load: every part audits the inlined graph, each inlined node named by its "
                     "call's name and its own")

    if loaded.repair_note:
        notes.append(loaded.repair_note)
    if data is None:
        notes.append("no evaluation data given: the replay split the calibration inputs into disjoint halves "
                     "(profiles from one, replay on the other) and the profile ran on the calibration inputs")
    report("static audit", 0, 1)
    shapes = _shapes(loaded, data if data is not None else calib, feeding)
    static = _static(loaded, block_pattern, coefficients, shapes)
    baseline_flops, base, base_static = None, None, None
    if baseline is not None:
        base = load_for_runtime(baseline)
        _check_baseline_inputs(loaded, base)
        base_static = _static(base, None, (), shapes)  # the profile's too: its FLOPs where they are what runs
        baseline_flops = _total_flops(base_static)
        base = _held_for_profile(baseline, base)
    report("static audit", 1, 1)
    clock.lap("static_s")

    why, batch_size = None, asked.batch_size
    if batch_size is None:
        from graphaudit.replay.batching import default_batch_size

        batch_size, why = default_batch_size(loaded, static.model_decides, shapes, feeding)
    failure = None
    # the static audit's coefficients are the replay's where its blocks are those the replay finds
    for_replay = static if block_pattern is None else None
    loaded, weights = _held_for_replay(loaded, asked, for_replay)
    try:
        replayed = _replay(loaded, calib, data, replace(asked, batch_size=batch_size, threads=threads),
                           for_replay, progress, weights)
    except (FrozenRunError, UnfreezableError) as err:  # a fact about the model's graph: the rest still stands
        replayed, failure = None, str(err)
        notes.append(f"the frozen replay stopped: {failure}")
    del weights  # the replay's sessions are gone: the profile's read the file
    from graphaudit.profile.session import held_for_profile

    loaded = held_for_profile(loaded)  # its graph alone where they do (after the replay on Ray too)
    if replayed is not None:
        why = replayed.settings.get("batch_size_note") or why  # the replay's own, with inputs it left out
        if why:
            notes.append(f"replay batch size {batch_size}: {why}")
        notes += [f"replay {about}: {note}" for about, note in replayed.setting_notes()]
    if replayed is None and failure is None:
        notes.append("no coefficient tensors (none declared in the model's metadata, named with --coefficients "
                      "or detected): the frozen replay did not run, so coefficient variation and functional "
                      "dependence are not measured")
    clock.lap("replay_s")
    if replayed is not None and replayed.settings.get("distributed"):
        notes.append("the replay ran on Ray workers; the profile ran in this process once they had ended, on one "
                     "machine with no worker beside it, since a neighbour's load would be in its latencies")

    report("profile", 0, 1)
    profiled = _profile(loaded, data if data is not None else calib, base,
                        replace(settings.profile, threads=threads), static,
                        lambda stage, done, total: report(f"profile: {stage}", done, total), base_static)
    report("profile", 1, 1)
    clock.lap("profile_s")

    parts = {"static": _json(static), "replay": _json(replayed), "profile": _json(profiled)}
    verdict = decide(parts["static"], parts["replay"], parts["profile"], baseline_flops=baseline_flops,
                     replay_failure=failure)
    inputs: dict[str, object] = {"calib": _source(calib), "data": None if data is None else _source(data),
              "baseline": None if baseline is None else _source(baseline), "coefficients": list(coefficients),
              "provider": provider, "seed": asked.seed, "threads": threads,
              "flush_denormals": asked.flush_denormals, "rewrite": asked.rewrite}
    if feeding:
        inputs["feeding"] = feeding.to_json()
    if asked.ray is not None:
        inputs["ray"] = asked.ray or "local"
        inputs["workers"] = asked.workers
    if is_baseline:
        inputs["is_baseline"] = True
    return AuditReport(
        model=_source(model), inputs=inputs, static=static, replay=replayed, profile=profiled, verdict=verdict,
        notes=tuple(notes), claims=tuple(check_claim(verdict, c) for c in claims), baseline_flops=baseline_flops,
        timing=clock.laps(), _parts=parts)


def audit_zoo(folder: str | os.PathLike, *, names: Sequence[str] = ZOO, baseline: str = "dense",
              progress: Progress | None = None, **options) -> list[tuple[str, AuditReport]]:
    """Audit each zoo model found under `folder` (`<name>/model.onnx`, calib.npz, eval.npz) against `baseline`."""
    root = Path(folder)
    found = [n for n in names if (root / n / "model.onnx").is_file()]
    if not found:
        raise GraphAuditError(f"expected the zoo's models under {root} ({', '.join(names)}/model.onnx), found none; "
                         "regenerate them with `python -m exporters.build --out fixtures` or pass --fixtures")
    base = root / baseline / "model.onnx"
    results = []
    for name in found:
        folder_n = root / name
        data = folder_n / "eval.npz"
        results.append((name, audit(folder_n / "model.onnx", folder_n / "calib.npz",
                                    data if data.is_file() else None, base if base.is_file() else None,
                                    progress=_prefixed(progress, name), **options)))
    return results


class _Clock:
    """Seconds per phase of one audit, read off perf_counter, and their total."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name], self.last = now - self.last, now

    def laps(self) -> dict[str, float]:
        return {**self.phases, "total_s": self.last - self.start}


def _static(loaded: LoadedModel, block_pattern, coefficients, shapes):
    from graphaudit.analyses.static import audit_static

    return audit_static(loaded, block_pattern=block_pattern, coefficients=tuple(coefficients), shapes=shapes)


def _replay(loaded, calib, data, settings, static, progress, weights):
    from graphaudit.replay.pipeline import replay

    result = replay(loaded, calib, data, settings, static=static, progress=progress, weights=weights)
    return result if result.coefficients else None


def _held_for_replay(loaded: LoadedModel, settings, static) -> tuple[LoadedModel, dict]:
    """`loaded` with its large inline weights taken out as the arrays the replay's sessions are
    handed (`replay.steps.held_apart`), and those arrays, where the profile's sessions read the
    model's file and the replay runs here: then nothing else needs them in the proto, and the
    proto held through the replay with them was a second copy (282 MB at Pythia-70M's shape).
    Otherwise `loaded` itself and none: the profile hands ORT the proto, Ray workers read it, or
    the replay, given the static audit `static` that found no coefficient, opens no session."""
    from graphaudit.profile.session import reads_its_file
    from graphaudit.replay.steps import held_apart

    if settings.ray is not None or not reads_its_file(loaded) or (static is not None and not static.coefficients):
        return loaded, {}
    return held_apart(loaded)


def _held_for_profile(baseline, base: LoadedModel):
    """What the profile is handed of the baseline `base`, loaded from `baseline`: its graph alone
    where the profile's sessions read its file (the proto read twice took a second or two at
    Pythia-160M's shape; its weights, 650 MB there, held through the replay, would be its peak);
    else the file again, or the LoadedModel the caller gave."""
    from graphaudit.profile.session import held_for_profile, reads_its_file

    if reads_its_file(base):
        return held_for_profile(base)
    return baseline if isinstance(baseline, (str, os.PathLike)) else base


def _profile(loaded, data, baseline, settings, static, progress=None, baseline_static=None):
    from graphaudit.profile import profile_model

    return profile_model(loaded, data, settings, baseline=baseline, static=static, baseline_static=baseline_static,
                         progress=progress)


def _shapes(loaded: LoadedModel, data, feeding=None) -> dict[str, tuple[int, ...]] | None:
    """The shape of one run's inputs of `data` (batch 1, or the model's own fixed batch, on each
    input's example axis), per graph input, for the static FLOP count."""
    from graphaudit.load.data import InputData, fixed_batch, input_specs, load_data

    specs = input_specs(loaded.model, feeding=feeding)
    inputs = data if isinstance(data, InputData) else load_data(data, specs, feeding)
    return inputs.run_shapes(fixed_batch(specs) or 1)


def _check_baseline_inputs(loaded: LoadedModel, base: LoadedModel) -> None:
    """Refuse a baseline whose inputs differ from the model's before anything is counted or run."""
    from graphaudit.load.data import input_specs
    from graphaudit.profile.baseline import check_same_inputs

    check_same_inputs(input_specs(loaded.model), input_specs(base.model), _source(base))


def _total_flops(static) -> float | None:
    flops = getattr(static, "flops", None)
    return None if flops is None else float(flops.total)


def _json(part) -> dict | None:
    return None if part is None else plain(part.to_json())


def _source(value) -> str:
    if isinstance(value, (str, os.PathLike)):
        return str(value)
    if hasattr(value, "weights_loaded"):  # a LoadedModel
        return str(value.path) if value.path is not None else value.name
    return getattr(value, "source", None) or type(value).__name__


def _same_file(model, baseline) -> bool:
    paths = [getattr(m, "path", None) if hasattr(m, "weights_loaded") else m for m in (model, baseline)]
    first, second = paths
    if not isinstance(first, (str, os.PathLike)) or not isinstance(second, (str, os.PathLike)):  # None too
        return False
    return Path(first).resolve() == Path(second).resolve()


def _prefixed(progress: Progress | None, name: str) -> Progress | None:
    if progress is None:
        return None
    return lambda stage, done, total: progress(f"{name}: {stage}", done, total)
