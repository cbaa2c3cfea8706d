"""Run graphaudit on the corpus and print, per model and fact, what the graph says against what graphaudit says.

    /work/main/.venv/bin/python scripts/corpus/check.py [--corpus /work/corpus] \
        [--python /work/main/.venv/bin/python] [--repo .] [--only ocr_cls vad] [--no-run]

The expected answers come from corpus.py (read from each graph; see README.md).  Reference
losses (the true-scale NLL of a labelled output, the MSE of an output against its targets)
are computed here with ONNX Runtime from the same inputs.  graphaudit's raw JSON and stderr
go to CORPUS/results/.  Options graphaudit may not have yet (--input-axes, --set,
--output-kind) are used where a model needs them and reported as 'not supported' when the CLI
refuses them; fields it may not report yet are 'not reported'.  Exit status 0 always: the
table is the result.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import MODELS  # noqa: E402

DECIDERS = ("caller", "shape", "constant", "model")
KINDS = ("logits", "probs", "logprobs", "regression")
EXPORTER_NAME = re.compile(r"^(p2o\.|helper\.|onnx::|/?_?[A-Za-z]+_\d+$)")
UNNORMALISED = "unnormalised (logits where shaped like a distribution, else values)"
NEW_OPTIONS = ("--input-axes", "--set", "--output-kind")
# today's control_flow[].dependence, read as a decider where no newer field says one
LEGACY = {"shape": "shape (dependence)", "const": "constant (dependence)", "value": "model (dependence=value)"}


class Runner:
    """Runs graphaudit commands, keeps their JSON, exit codes and wall times."""

    def __init__(self, python, repo, results):
        self.python, self.repo, self.results = python, repo, results
        self.env = dict(os.environ, PYTHONPATH=str(repo))
        results.mkdir(parents=True, exist_ok=True)
        self.help = {c: self._call([c, "--help"])[1] for c in ("static", "run")}

    def _call(self, args):
        """Return (rc, stdout, stderr, seconds) of one graphaudit call."""
        t0 = time.monotonic()
        p = subprocess.run([self.python, "-m", "graphaudit", *args], env=self.env, cwd=self.repo,
                           capture_output=True, text=True)
        return p.returncode, p.stdout, p.stderr, time.monotonic() - t0

    def supports(self, command, option):
        return option in self.help.get(command, "")

    def call(self, tag, command, args, extra=()):
        """Run command with args plus the extra options it supports; return (rc, json|None, stderr, s, dropped)."""
        dropped = [o for o in extra if not self.supports(command, o[0])]
        used = [x for o in extra if o not in dropped for x in o]
        rc, out, err, secs = self._call([command, *args, *used])
        if rc == 2 and "no such option" in err.lower() and used:
            dropped, used = list(extra), []
            rc, out, err, secs = self._call([command, *args])
        (self.results / f"{tag}.{command}.json").write_text(out)
        (self.results / f"{tag}.{command}.stderr").write_text(err)
        try:
            doc = json.loads(out) if out.strip() else None
        except json.JSONDecodeError:
            doc = None
        return rc, doc, err.strip().splitlines()[-1:] if err.strip() else [], secs, dropped


def walk(doc):
    """Yield every dict inside a JSON document."""
    if isinstance(doc, dict):
        yield doc
        for v in doc.values():
            yield from walk(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from walk(v)


def output_kind_said(doc, output):
    """Return the kind graphaudit says it read an output as, or None: any dict naming the output with a kind."""
    for d in walk(doc):
        if "labels" in d and "mask" in d:  # the replay's task: its kind is the loss, not the output's scale
            continue
        if output in (d.get("output"), d.get("name")):
            for key in ("read_as", "output_kind", "kind", "scale", "as"):
                if d.get(key) in KINDS:
                    return d[key]
    for d in walk(doc):  # {output: kind} maps
        if d.get(output) in KINDS:
            return d[output]
    for entry in (doc.get("static") or doc).get("outputs") or []:  # static's reading with no normalising operator
        if entry.get("output") == output and "kind" in entry and entry["kind"] is None:
            return UNNORMALISED
    return None


def decider_said(entry):
    """Return (decider, source) from a control-flow entry, whatever the new fields are called."""
    decider = source = None
    for key, value in entry.items():
        if isinstance(value, str) and value in DECIDERS and key not in ("kind", "op"):
            decider = value
        if key in ("sources", "source", "from", "decided_from", "input", "condition_input", "origin", "decider_input") \
                and isinstance(value, (str, list)):
            source = value if isinstance(value, str) else ",".join(map(str, value))
    return decider, source


def reference(key, m, corpus):
    """Return true-scale reference losses on data.npz: {'nll': x} for labels, {'mse': x} for targets."""
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError:
        return {}
    ort.set_default_logger_severity(3)  # the captcha's declared output shape is wrong; ORT warns per call
    d = dict(np.load(corpus / key / "data.npz"))
    sess = ort.InferenceSession(str(corpus / key / m["file_name"]), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    axes = {k: m["batch_axis"].get(k, 0) for k in names}
    n = d[names[0]].shape[0]
    if m["fixed_batch"]:
        outs = [sess.run(None, {k: np.take(d[k], [i], axis=axes[k]) for k in names}) for i in range(n)]
        first = np.concatenate([o[0] for o in outs], axis=0)
    else:
        first = sess.run(None, {k: d[k] for k in names})[0]
    ref = {}
    eps = 1e-7
    if "labels" in d:
        y = d["labels"]
        if first.shape[-1] == 1:  # one sigmoid: Bernoulli
            p = np.clip(first.reshape(-1), eps, 1 - eps)
            ref["nll"] = float(np.mean(-(y * np.log(p) + (1 - y) * np.log(1 - p))))
        else:
            p = np.clip(first[np.arange(n), y], eps, 1.0)
            ref["nll"] = float(np.mean(-np.log(p)))
    if "targets" in d:
        ref["mse"] = float(np.mean((first - d["targets"]) ** 2))
    return ref


def find_number(doc, names):
    """Return the first number under any of names inside the `correct` condition of the replay."""
    replay = (doc or {}).get("replay") or {}
    correct = ((replay.get("conditions") or {}).get("correct")) or {}
    for name in names:
        if isinstance(correct.get(name), (int, float)):
            return correct[name]
        for d in walk(correct):
            if isinstance(d.get(name), (int, float)):
                return d[name]
    return None


def close(a, b):
    return a is not None and b is not None and abs(a - b) <= max(2e-3, 0.02 * abs(b))


def check_model(key, m, corpus, runner, do_run):
    """Return rows (model, fact, expected, said, status) for one model."""
    rows = []
    def row(fact, expected, said, ok=None):
        said_text = str(said)
        if ok is None and said_text.startswith(("not supported", "not reported")):
            status = said_text.split(" (")[0]
        else:
            status = "ok" if (ok if ok is not None else expected == said) else "WRONG"
        rows.append((key, fact, str(expected), str(said), status))
    folder = corpus / key
    model = str(folder / m["file_name"])
    data, calib = str(folder / "data.npz"), str(folder / "calib.npz")
    extra = []
    if m["batch_axis"] and not m["same_dims"]:  # the graph does not tie the axis: the caller says it
        for name, axis in m["batch_axis"].items():
            rank = 3
            extra.append(("--input-axes", f"{name}=" + ",".join("batch" if i == axis else "_" for i in range(rank))))

    rc, doc, err, secs, dropped = runner.call(key, "static", [model, "--data", data, "--format", "json"], extra)
    row("static exit code", 0, f"{rc} ({secs:.1f}s){' ' + err[0][:90] if rc else ''}", ok=rc == 0)
    for opt in dropped:
        row(f"option {opt[0]} {opt[1]}", "accepted", "not supported")
    if doc is None:
        rc2, doc, _err2, secs2, _ = runner.call(key + ".nodata", "static", [model, "--format", "json"])
        row("static without --data exit code", 0, f"{rc2} ({secs2:.1f}s)", ok=rc2 == 0)
    if doc is not None:
        row("conditional_execution", m["conditional_execution"], doc.get("conditional_execution"))
        row("dynamic", m["dynamic"], doc.get("dynamic"))
        # `decisions` (who decides each If and Loop) where graphaudit reports them, else today's control flow
        flow = doc.get("decisions") or doc.get("control_flow") or []
        for branch in m["branches"]:
            entries = [e for e in flow if e.get("node") == branch["node"]] if "*" not in branch["node"] else \
                [e for e in flow if e.get("node") not in {b["node"] for b in m["branches"]}]
            if not entries:
                row(f"branch {branch['node'][:28]} decider", branch["decider"], "not listed", ok=False)
                continue
            said = sorted({decider_said(e)[0] or LEGACY.get(str(e.get("dependence")), "not reported")
                           for e in entries})
            text = ",".join(said)
            accepted = set(branch["decider"].split("|"))
            row(f"branch {branch['node'][:28]} decider", branch["decider"], text,
                ok=None if text == "not reported" else set(s.split(" ")[0] for s in said) <= accepted)
            if "same_weights" in branch:
                nodes = {e.get("node") for e in entries}
                claims_same = any("same weights" in str(e.get("text", "")) + str(e.get("reason", ""))
                                  for e in entries + [c for c in doc.get("control_flow") or [] if c.get("node") in nodes])
                row(f"branch {branch['node'][:28]} same weights", branch["same_weights"], claims_same)
            sources = sorted({decider_said(e)[1] or "" for e in entries} - {""})
            row(f"branch {branch['node'][:28]} source", branch["source"], ",".join(sources) or "not reported",
                ok=None if not sources else all(s in ",".join(sources) for s in branch["source"].split(", ")))
        gates = [c for c in doc.get("coefficients") or [] if c.get("family") == "gate"]
        found = {c["tensor"]: c.get("layer") for c in gates}
        want = [t for t, _ in m["se_gates"]]
        missing = [t for t in want if t not in found]
        # a model-decided branch's own probability may be reported as its controller's coefficient
        deciders = {b["source"] for b in m["branches"] if b["decider"] == "model"}
        extra_g = [t for t in found if t not in want and t not in deciders]
        allowed = [t for t in found if t in deciders]
        row("SE gates found", len(want), f"{len(found)}" + (f" ({allowed[0]}: the branch's decider)" if allowed else "") +
            (f" missing {missing}" if missing else "") +
            (f" extra {extra_g}" if extra_g else ""), ok=not missing and not extra_g)
        if len(want) > 1 and not missing:
            layers = [found[t] for t in want]
            depths = [d for _, d in m["se_gates"]]
            inverted = any(depths[i] < depths[j] and layers[i] is not None and layers[j] is not None
                           and layers[i] > layers[j] for i in range(len(want)) for j in range(len(want)))
            merged = any(depths[i] != depths[j] and layers[i] == layers[j]
                         for i in range(len(want)) for j in range(len(want)))
            row("gate layers follow depth", f"depths {depths}", f"layers {layers}", ok=not inverted and not merged)
        names = [b.get("name") or "" for b in doc.get("blocks") or []]
        # a block that is an If's or Loop's body is named after that node, whatever its exporter called it
        owners = {e.get("node") for e in doc.get("control_flow") or []}
        bad = [n for n in names if EXPORTER_NAME.match(n) and n not in owners]
        row("blocks not named by exporter", "no p2o./helper. names", f"{len(names)} blocks" +
            (f", e.g. {bad[:2]}" if bad else ""), ok=not bad)
        for name, (trips, per_iteration) in m.get("loops", {}).items():
            said = next((lp for lp in (doc.get("flops") or {}).get("loops") or [] if lp.get("node") == name), None)
            row(f"loop {name[:28]} trips, FLOPs each", f"{trips}, {per_iteration:,}",
                "not listed" if said is None else f"{said.get('trip_count')}, {said.get('flops_per_iteration') or 0:,}")
        for name, verdict in m.get("block_verdicts", {}).items():
            said = next((b.get("verdict") for b in doc.get("blocks") or [] if b.get("name") == name), "not listed")
            row(f"block {name[:28]} verdict", verdict, said)
    want_claim = "dynamic" if m["dynamic"] else "static"
    rc, _, err, secs, _ = runner.call(key + ".expect", "static", [model, "--expect", want_claim, "--format", "json"])
    row(f"static --expect {want_claim} exit", 0, rc, ok=rc == 0)

    if not do_run:
        return rows
    args = [model, "--calib", calib, "--data", data, "--runs", "3", "--warmup", "1", "--profile-runs", "1",
            "--resamples", "200", "--threads", "2", "-q", "--format", "json"]
    for name in m.get("coefficients", ()):  # a model with none of its own: a tensor named, so the replay scores it
        args += ["--coefficients", name]
    rc, doc, err, secs, dropped = runner.call(key, "run", args, extra)
    row("run exit code", 0, f"{rc} ({secs:.1f}s){' ' + err[0][:90] if rc else ''}", ok=rc == 0)
    if doc is None:
        return rows
    for out, (kind, _why) in m["outputs"].items():
        said = output_kind_said(doc, out)
        # scored as logits where shaped like a distribution, else as values: say so, where the
        # graph's answer is one of those; probabilities read so are scored as logits (wrong)
        if said == UNNORMALISED and kind in ("logits", "regression"):
            rows.append((key, f"output {out[:24]} read as", kind, said, "by shape"))
            continue
        row(f"output {out[:24]} read as", kind, said or "not reported", ok=None if said is None else said == kind)
    ref = reference(key, m, corpus)
    task = ((doc.get("replay") or {}).get("task")) or {}
    verdict = doc.get("verdict") or {}
    fd = (verdict.get("functional_dependence") or {}).get("answer")
    if doc.get("replay"):
        if "nll" in ref:
            nll = find_number(doc, ["nll"])
            row("correct NLL on true scale", f"{ref['nll']:.4f}", f"{nll:.4f}" if nll is not None else None,
                ok=close(nll, ref["nll"]))
        if "mse" in ref:
            mse = find_number(doc, ["mse", "sq_err"])
            row("correct MSE vs targets", f"{ref['mse']:.4f}", f"{mse:.4f}" if mse is not None else None,
                ok=close(mse, ref["mse"]))
        if m["distribution"] and "labels" not in m:
            kl = find_number(doc, ["kl"])
            row("KL from correct measured", "a number", kl if kl is not None else "none", ok=kl is not None)
        row("functional dependence measured", "yes|no", fd, ok=fd in ("yes", "no"))
        row("task", "output " + "/".join(m["outputs"]), f"{task.get('kind')} on {task.get('output')}",
            ok=task.get("output") in m["outputs"])
    ce = (verdict.get("conditional_execution") or {}).get("answer")
    row("verdict conditional execution", "yes" if m["conditional_execution"] else "no", ce)
    texts = " | ".join(str(d.get("text", "")) + " " + str(d.get("statement", "")) for d in walk(doc))
    contradiction = re.search(r"every one of \d+ blocks ran in full", texts) and re.search(r"ran on none", texts)
    row("report does not contradict itself", "no contradiction", "contradiction" if contradiction else "none",
        ok=not contradiction)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="/tmp/graphaudit-corpus")
    parser.add_argument("--python", default="/work/main/.venv/bin/python")
    parser.add_argument("--repo", default=str(HERE.parent.parent))
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--no-run", action="store_true", help="static and inspect only (fast)")
    args = parser.parse_args()
    corpus = Path(args.corpus).resolve()
    runner = Runner(args.python, Path(args.repo).resolve(), corpus / "results")
    print("graphaudit options:", ", ".join(f"{o} {'yes' if runner.supports('run', o) or runner.supports('static', o) else 'no'}"
                                           for o in NEW_OPTIONS))
    rows = []
    for key, m in MODELS.items():
        if args.only and key not in args.only:
            continue
        if not (corpus / key / m["file_name"]).exists():
            rows.append((key, "model file", "present", "missing: run build.py", "WRONG"))
            continue
        rows.extend(check_model(key, m, corpus, runner, not args.no_run))
    widths = [max(len(r[i]) for r in rows + [("model", "fact", "expected", "graphaudit", "status")]) for i in range(5)]
    widths = [min(w, 60) for w in widths]

    def line(r):
        return "  ".join(str(c)[:w].ljust(w) for c, w in zip(r, widths))

    print(line(("model", "fact", "expected", "graphaudit", "status")))
    for r in rows:
        print(line(r))
    count = {s: sum(r[4] == s for r in rows) for s in ("ok", "WRONG", "not supported", "not reported")}
    print(f"{len(rows)} facts: " + ", ".join(f"{n} {s}" for s, n in count.items()))
    (corpus / "results" / "table.json").write_text(json.dumps(rows, indent=0))


if __name__ == "__main__":
    main()
