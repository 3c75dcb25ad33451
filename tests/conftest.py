"""Test-wide settings. Hypothesis: no per-example deadline (CI machines are slow and shared;
speed is measured in benchmarks/, never asserted) and derandomised, so a CI run is
reproducible and cannot turn red by drawing a new example."""

from hypothesis import settings

settings.register_profile("simcluster", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("simcluster")
