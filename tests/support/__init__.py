"""Helpers the test modules share: tiny models, the command line's contract, report samples.

Test modules import from here, never from one another (tests/test_layout.py checks it);
pytest fixtures shared by several modules are in tests/conftest.py.
"""
