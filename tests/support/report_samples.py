"""Hand-written sub-reports shaped like the static audit's, the replay's and the profile's JSON.

They stand for the zoo's models (numbers in the spirit of the paper) so that the verdict and
the renderers are tested without running anything.
"""

from graphaudit.verdict.decide import decide


def static_doc(verdicts, conditional=None):
    blocks = [{"name": f"blocks.{i}", "index": i, "verdict": v, "flops": 1_000_000.0 * (i + 1),
               "evidence": [{"kind": "gate", "node": f"gate_{i}", "op": "Mul", "tensor": f"gate_{i}",
                             "dependence": "value", "text": f"evidence for block {i}"}]}
              for i, v in enumerate(verdicts)]
    cond = any(v in ("branch", "subset") for v in verdicts) if conditional is None else conditional
    return {"blocks": blocks, "coefficients": [], "conditional_execution": cond}


def replay_doc(cross=(0.02, 0.015, 0.025), shuffle=(0.03, 0.02, 0.04), gap_layer=0.987, eta2=0.91,
               family="gate", input_share=0.05, token_share=0.04):
    def cond(nll, delta, ci):
        return {"nll": nll, "delta_nll": delta, "ci": list(ci)}
    return {
        "parity": {"max_abs_diff": 2e-6, "ok": True},
        "conditions": {
            "correct": {"nll": 2.0, "delta_nll": 0.0, "ci": [0.0, 0.0]},
            "cross_input": cond(2.0 + cross[0], cross[0], cross[1:]),
            "token_shuffle": cond(2.0 + shuffle[0], shuffle[0], shuffle[1:]),
            "static_layer": cond(2.01, 0.01, (0.005, 0.015)),
            "static_position": cond(2.008, 0.008, (0.004, 0.012)),
            "global_mean": cond(2.8, 0.8, (0.7, 0.9)),
        },
        "retained_gap": {"static_layer": gap_layer, "static_position": 0.99},
        "variance": {family: {"eta2_layer": eta2, "layer_slot_share": 1 - input_share - token_share,
                              "input_share": input_share, "token_share": token_share}},
        "seed": 0,
    }


OTHER = {"name": "(other)", "median_ms": 0.05, "share": 0.01, "executed_fraction": 1.0}


def profile_doc(fractions=(1.0, 1.0, 1.0, 1.0), ratio=1.31, base_ms=2.0, inputs=4):
    """Shaped like ProfileReport.to_json(): blocks with execution evidence, inputs, baseline."""
    names = [f"blocks.{i}" for i in range(len(fractions))]
    blocks = [{"name": name, "median_ms": 0.4 + 0.1 * i, "p10_ms": 0.36 + 0.09 * i, "p90_ms": 0.48 + 0.12 * i,
               "mean_ms": 0.4 + 0.1 * i, "share": 0.2,
               "executed_fraction": f, "nodes": 20, "inputs": inputs, "inputs_executed": round(f * inputs),
               "node_fraction": {"min": 1.0 if f == 1 else 0.0, "median": 1.0, "max": 1.0, "total": 20.0},
               "executed_flops": {"min": 1e6 * (i + 1) * ((f < 1 and 0) or 1), "median": 1e6 * (i + 1),
                                  "max": 1e6 * (i + 1), "total": 4e6 * (i + 1)},
               "value_dependent_shapes": []}
              for i, (name, f) in enumerate(zip(names, fractions))]
    per_input = [{"index": k, "rows": [k, k + 1],
                  "blocks_ran": [n for n, f in zip(names, fractions) if k < round(f * inputs)],
                  "flops": {}, "latency_ms": 2.0} for k in range(inputs)]
    median = base_ms * (ratio or 1)
    return {"model": "model.onnx", "provider": "CPUExecutionProvider",
            "latency_ms": {"median": median, "p10": median * 0.9, "p90": median * 1.2, "n": 20},
            "coverage": 0.97, "profiling_overhead": 1.3, "blocks": blocks + [OTHER], "inputs": inputs,
            "per_input": per_input,
            "baseline": None if ratio is None else {
                "model": "dense.onnx", "latency_ms": base_ms,
                "latency_spread_ms": {"median": base_ms, "p10": base_ms * 0.9, "p90": base_ms * 1.1, "n": 20},
                "ratio": ratio, "ratio_spread": {"median": ratio, "p10": ratio - 0.05, "p90": ratio + 0.05, "n": 20},
                "ratio_interval": {"low": ratio - 0.02, "high": ratio + 0.02, "level": 0.95, "rounds": 20},
                "slower_pct": (ratio - 1) * 100,
                "blocks": [{"name": name, "median_ms": 0.3 + 0.05 * i, "p10_ms": 0.28 + 0.05 * i,
                            "p90_ms": 0.35 + 0.05 * i, "mean_ms": 0.3 + 0.05 * i, "share": 0.22}
                           for i, name in enumerate(names)]}}


def featuregate():
    return static_doc(["gated"] * 4), replay_doc(), profile_doc(ratio=1.308)


def mudd():
    return (static_doc(["gated"] * 4),
            replay_doc(cross=(1.9067, 1.8, 2.0), shuffle=(2.9637, 2.8, 3.1), gap_layer=0.62, eta2=0.87,
                       family="mudd"),
            profile_doc(ratio=1.12))


def earlyexit():
    return (static_doc(["always", "always", "branch", "branch"]),
            replay_doc(family="exit", eta2=0.0, input_share=0.6, token_share=0.4),
            profile_doc(fractions=(1.0, 1.0, 0.5, 0.5), ratio=0.8))


def dense():
    return static_doc(["always"] * 4), None, profile_doc(ratio=1.0)


def document(parts, *, model="fixtures/featuregate/model.onnx", claims=(), coefficient_means=True):
    static, replay, profile = parts
    verdict = decide(static, replay, profile)
    doc = {
        "version": "1.0",
        "graphaudit_version": "0.1.0",
        "model": model,
        "inputs": {"calib": "calib.npz", "data": "eval.npz", "baseline": "dense.onnx", "coefficients": [],
                   "provider": "cpu", "seed": 0},
        "notes": [] if replay is not None else ["no coefficient tensors: the frozen replay did not run"],
        "static": static,
        "replay": replay,
        "profile": profile,
        "verdict": verdict.to_json(),
        "claims": list(claims),
    }
    if coefficient_means and replay is not None:
        doc["coefficient_means"] = {family: {"layers": [0, 1, 2, 3],
                                             "values": [[0.1 * layer + 0.01 * t for t in range(8)] for layer in range(4)]}
                                    for family in replay["variance"]}
    return doc
