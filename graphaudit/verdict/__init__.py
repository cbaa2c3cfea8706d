"""The verdict: four questions answered from the static, replay and profile reports.

`findings` holds the answers and their evidence; `conditional_execution` answers the third question
(can a block be skipped or shrunk, was one, who decides), `compute_savings` the fourth (faster than
the dense baseline, fewer FLOPs); `decide` assembles all four.
"""
