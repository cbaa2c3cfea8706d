"""graphaudit's domain words, defined once: the block verdicts and the coefficients' axes.

Every layer reads them (the loader names the batch axis, the analyses find verdicts, the
profile and the reports read them back from JSON), so they sit at the package root and
import nothing. They are plain strings: the JSON reports spell them as written here.
"""

from __future__ import annotations

# -- block verdicts (docs/design.md, "Execution verdicts"; analyses.block_verdicts finds them) --
ALWAYS = "always"  # every node runs for every input, at a size set by shapes
GATED = "gated"  # a coefficient tensor weights the block's output
MASKED = "masked"  # routing exists, but every path is computed at full size, then masked or picked
SUBSET = "subset"  # its compute reads rows picked by value, or runs at a value-dependent size
BRANCH = "branch"  # its compute sits in an If or Loop that input values decide
VERDICTS = (ALWAYS, GATED, MASKED, SUBSET, BRANCH)  # weakest to strongest
# The verdicts under which values decide what runs: only these can skip or shrink compute.
SAVES_COMPUTE = frozenset({SUBSET, BRANCH})

# -- a coefficient's axes (analyses.declared_coefficients reads them from the metadata) --------
BATCH = "batch"  # one entry per input (also the example axis of an --input-axes layout)
TOKEN = "token"  # one entry per position of an input
MERGED = f"{BATCH}*{TOKEN}"  # one axis for both, batch-major
PER_INPUT = (BATCH, TOKEN, MERGED)  # the axes whose size the inputs set; any other is a slot's

# The claims graphaudit checks (`run --claim`, `static --claim`), one name for one idea.
DYNAMIC_INFERENCE, COMPUTE_SAVINGS, STATIC_EXECUTION = "dynamic-inference", "compute-savings", "static-execution"
# What the graph alone can refute, with the execution each claims (analyses.static.contradiction).
STATIC_CLAIMS = {DYNAMIC_INFERENCE: "dynamic", STATIC_EXECUTION: "static"}
EXPECTED_EXECUTION = tuple(STATIC_CLAIMS.values())  # `static --expect`, the older spelling of --claim
