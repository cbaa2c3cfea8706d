"""The speech corpus models' inputs (silero-vad, openwakeword), spoken by espeak-ng at 16 kHz.

Run by make_inputs.py inside the corpus's scratch venv; see its docstring.
"""
import random
import subprocess
import tempfile

import numpy as np
from corpus import N_CALIB, N_DATA
from scipy.io import wavfile
from scipy.signal import resample_poly


def speak(text, voice="en", speed=150, pitch=50):
    """Return espeak-ng's speech for text at 16 kHz as float32 in [-1, 1]."""
    with tempfile.NamedTemporaryFile(suffix=".wav") as tmp:
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", tmp.name, text],
                       check=True, capture_output=True)
        rate, pcm = wavfile.read(tmp.name)
    audio = pcm.astype(np.float32) / 32768.0
    return resample_poly(audio, 16000, rate).astype(np.float32)


SENTENCES = ["The meeting starts at nine tomorrow morning.", "Please turn left at the next corner.",
             "I think it might rain later today.", "Can you send me the report by Friday?"]


def vad_audio():
    """Return 16 kHz audio of sentences with pauses and a per-sample speech mask."""
    parts, mask = [], []
    rng = np.random.default_rng(0)
    for k, s in enumerate(SENTENCES):
        gap = np.zeros(int(16000 * 0.6), np.float32)
        speech = speak(s, voice=["en", "en-us", "en+f3", "en-gb"][k], speed=140 + 10 * k)
        parts += [gap, speech]
        energy = np.convolve(np.abs(speech), np.ones(160) / 160, "same")
        mask += [np.zeros_like(gap), (energy > 0.01).astype(np.float32)]
    audio = np.concatenate(parts)
    audio = audio + rng.normal(0, 0.002, audio.shape).astype(np.float32)  # room noise
    return audio, np.concatenate(mask)


def vad(m, out):
    # silero_vad.utils_vad.OnnxWrapper's preprocessing, without torch: 512-sample chunks at
    # 16 kHz with the previous 64 samples prepended, the state carried from chunk to chunk.
    import onnxruntime as ort
    audio, mask = vad_audio()
    sess = ort.InferenceSession(str(out / m["file_name"]), providers=["CPUExecutionProvider"])
    chunk, ctx = 512, 64
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros((1, ctx), np.float32)
    xs, states, targets = [], [], []
    n = len(audio) // chunk
    picks = set(np.linspace(4, n - 1, N_CALIB + N_DATA).astype(int).tolist())
    for i in range(n):
        x = np.concatenate([context, audio[None, i * chunk:(i + 1) * chunk]], axis=1)
        if i in picks:
            xs.append(x)
            states.append(state)
            targets.append([float(mask[i * chunk:(i + 1) * chunk].mean() > 0.3)])
        _, state = sess.run(None, {"input": x, "state": state, "sr": np.array(16000, np.int64)})
        context = x[:, -ctx:]
    arrays = {"input": np.concatenate(xs), "state": np.concatenate(states, axis=1),
              "sr": np.array(16000, np.int64), "targets": np.array(targets, np.float32)}
    return arrays, {}, \
        "espeak-ng sentences with 0.6 s pauses at 16 kHz plus faint noise; 16 chunks picked along the stream: input (N,576) = 64 context + 512 samples, state (2,N,128) as carried by the stream, sr a 0-d int64 16000; targets (N,1): 1 where espeak's own signal is voiced in >30% of the chunk"


def wakeword(m, out):
    import onnxruntime as ort
    from openwakeword.utils import AudioFeatures
    sess = ort.InferenceSession(str(out / m["file_name"]), providers=["CPUExecutionProvider"])
    pos = [("hey jarvis", "en", 150), ("hey jarvis", "en-us", 130), ("hey jarvis", "en+f3", 160),
           ("hey jarvis", "en-gb", 140), ("hey jarvis", "en+m3", 120), ("hey jarvis", "en-us+f2", 150),
           ("hey jarvis", "en", 170), ("hey jarvis", "en-gb+f4", 135)]
    neg = [("hey marvin", "en", 150), ("good morning", "en-us", 140), ("turn on the lights", "en", 150),
           ("hey travis", "en-gb", 140), ("what time is it", "en+f3", 150), ("jars of jam", "en-us", 140),
           ("hello there", "en", 160), ("have a nice day", "en-gb+f4", 140)]
    rows = []
    for label, items in ((1, pos), (0, neg)):
        for text, voice, speed in items:
            audio = speak(text, voice, speed)
            clip = np.concatenate([np.zeros(8000, np.float32), audio, np.zeros(16000, np.float32)])
            pcm = (clip * 32767).astype(np.int16)
            feats = AudioFeatures()
            windows = []
            for j in range(0, len(pcm) - 1280, 1280):
                feats(pcm[j:j + 1280])
                windows.append(feats.get_features(16))
            scores = [float(sess.run(None, {"x.1": w})[0].ravel()[0]) for w in windows]
            # what the package acts on: the window of the clip with the highest score
            rows.append((label, windows[int(np.argmax(scores))], max(scores), text))
    random.Random(0).shuffle(rows)
    calib = [r for r in rows if r[0] == 1][:4] + [r for r in rows if r[0] == 0][:4]
    data = [r for r in rows if r[0] == 1][4:] + [r for r in rows if r[0] == 0][4:]
    ordered = calib + data
    arrays = {"x.1": np.concatenate([r[1] for r in ordered]).astype(np.float32),
              "labels": np.array([r[0] for r in ordered], np.int64)}
    info = {"texts": [r[3] for r in ordered], "package_scores": [round(r[2], 4) for r in ordered]}
    return arrays, info, \
        "espeak-ng 'hey jarvis' (8 voices) and 8 other phrases, 16 kHz int16 streamed in 1280-sample frames through openwakeword.utils.AudioFeatures (its melspectrogram and embedding models); per clip the (1,16,96) window the model scores highest; labels 1 = 'hey jarvis'; batch fixed at 1"
