"""Timing and memory benchmarks of the real layer, and their `python -m` entry points."""
