"""fixtures/README.md, rendered from the facts build.py records in zoo.json."""

from __future__ import annotations

# Sections below this line are measured by graphaudit's own commands (replay, profile) and
# written by hand or by their scripts; regenerating the zoo keeps them.
MEASURED_MARKER = "<!-- Measured results below: kept when the zoo is regenerated. -->"


def measured_sections(text: str) -> str:
    """The part of an existing fixtures/README.md from the measured-results marker on."""
    at = text.find(MEASURED_MARKER)
    return "\n" + text[at:] if at >= 0 else ""


def render_readme(zoo: dict) -> str:
    """Return the Markdown text of fixtures/README.md for the content of zoo.json."""
    corpus, models = zoo["corpus"], zoo["models"]
    entropy = corpus["unigram_entropy_nats"]
    lines = [
        "# Reference model zoo (generated)",
        "",
        "Small byte-level causal language models, trained briefly and exported to ONNX with",
        "their coefficient metadata (`graphaudit.coefficients`). Written by `exporters/build.py`;",
        "do not edit by hand. Regenerate from the repository root (about ten minutes; it",
        "trains on one CPU thread):",
        "",
        "```",
        zoo["command"],
        "```",
        "",
        f"Built with Python {zoo['python']} (its standard library is the corpus), "
        f"torch {zoo['torch']}, seed {zoo['seed']}. Another Python version has slightly "
        "different stdlib files, so it gives different (equally valid) fixtures.",
        "",
        "## Corpus",
        "",
        f"{corpus['source']}, split by file: {corpus['files']['train']} train, "
        f"{corpus['files']['calib']} calib and {corpus['files']['eval']} eval files "
        f"({corpus['train_bytes']:,} train bytes). Unigram (byte) entropy of the train split: "
        f"**{entropy} nats** (eval split: {corpus['eval_unigram_entropy_nats']}).",
        "",
        f"`calib.npz` and `eval.npz` (the same in every folder) hold `input_ids`, int64, "
        f"shape {tuple(zoo['data']['calib'])} and {tuple(zoo['data']['eval'])}: one window per "
        "file, calib and eval from disjoint held-out files.",
        "",
        "## Models",
        "",
        "| model | parameters | coefficient tensors (axes) | eval NLL (nats) | below unigram by |",
        "|---|---|---|---|---|",
    ]
    for name, m in models.items():
        coefs = ", ".join(f"`{c['tensor']}`" for c in m["coefficients"]) or "none"
        axes = f" ({', '.join(m['coefficients'][0]['axes'])})" if m["coefficients"] else ""
        lines.append(
            f"| {name} | {m['parameters']:,} | {coefs}{axes} | {m['eval_nll']} "
            f"| {entropy - m['eval_nll']:.3f} |"
        )
    if "earlyexit" in models:
        ee = models["earlyexit"]
        k, n = ee["exit_after"], ee["config"]["n_layers"]
        lines += [
            "",
            f"EarlyExit skips blocks {k + 1}–{n - 1} when every input of the batch has a "
            f"mean top-probability (`exit.{k}`, averaged over tokens) above "
            f"{ee['threshold']:.4f}, the median over the calibration inputs: "
            f"{ee['calib_exits']} of {zoo['data']['calib'][0]} calibration and "
            f"{ee['eval_exits']} of {zoo['data']['eval'][0]} eval inputs exit early when run "
            "one per batch. Its eval NLL is measured that way.",
        ]
    steps = [row["step"] for row in next(iter(models.values()))["curve"]]
    for key, title in (("train_nll", "Train"), ("eval_nll", "Eval")):
        lines += [
            "",
            f"## {title} NLL (nats) by step",
            "",
            "| step | " + " | ".join(models) + " |",
            "|---|" + "---|" * len(models),
        ]
        for i, step in enumerate(steps):
            row = [str(m["curve"][i][key]) for m in models.values()]
            lines.append(f"| {step} | " + " | ".join(row) + " |")
    lines += [
        "",
        "Train NLL is the mean over the steps since the previous row; eval NLL is on",
        "`eval.npz` in one batch (EarlyExit runs every block here: its threshold is calibrated",
        "after training).",
        f"Schedule: {_schedule(zoo['schedule'])}.",
        "",
        "## Files",
        "",
        "- `<model>/model.onnx`: the live graph, `input_ids` (batch, seq) → `logits`",
        "  (batch, seq, 256); coefficient tensors are named intermediate values.",
        "- `<model>/model.frozen.onnx` (not dense): the same model with each coefficient tensor",
        "  a graph input of the same name and the controllers removed.",
        "- `<model>/state_dict.pt`: the trained weights, for `exporters.zoo.load_trained`.",
        "- `zoo.json`: everything on this page, for tests.",
        "",
    ]
    return "\n".join(lines)


def _schedule(s: dict) -> str:
    return (
        f"{s['steps']} AdamW steps, batch {s['batch']} × {s['length']} bytes, peak lr {s['lr']} "
        f"({s['warmup']} warm-up steps, cosine to a tenth), weight decay {s['weight_decay']}, "
        f"gradient clip {s['clip']}"
    )
