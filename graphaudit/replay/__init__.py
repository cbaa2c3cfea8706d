"""Frozen-Controller Auditing: cache the coefficients, switch the controller off, replay.

In the order the data flows: `surgery` writes the trace graph (coefficients as outputs) and the
frozen graph (coefficients as inputs); `capture` runs the trace graph and caches every input's
coefficients (kept on disk by `cache_files`); `conditions` maps them to what each condition feeds;
`parity` checks the frozen graph reproduces the live model; `prefix` and `rewrite` (with
`rewrite_attention`) make the frozen graph cheaper to run without changing what it computes;
`batching` cuts the inputs to batches; `loop` replays every condition into streaming statistics;
`variance` decomposes a coefficient family's variance; `pipeline.replay` runs all of it, and
`frozen_files` writes the two graphs for `graphaudit freeze`. Every graph transform is a pass
that keeps one contract (`passes`: what it gives back, who may change a model).
"""
