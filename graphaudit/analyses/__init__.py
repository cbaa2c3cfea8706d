"""Analyses of a ModelGraph: pure functions that return frozen dataclasses.

dependence (what each tensor depends on) → blocks (which nodes form layer i) →
coefficients (which tensors are the controller's) → verdicts (can a block be skipped or
shrunk) and flops (how much each node costs) → static (the assembled StaticReport).
"""
