"""A model and its inputs, loaded and checked before anything reads them.

`model` loads an ONNX file (size first, external weights checked unread by `external_data`, the
ONNX checker in `checker`, exact repairs in `repair`, local functions inlined by `inline`, free
dimensions named by `free_dims`, shape inference run by `inference`, helped by `contrib_shapes`
and `shape_values`); `npz` reads untrusted archives, `data` checks them against the graph
inputs, and `feeding` says how each input is fed. `protos` walks the nested graphs of a ModelProto.
"""
