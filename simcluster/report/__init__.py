"""Results -> tables, figure data, plots (the only package that imports matplotlib).

It only reads: the result types live in `simcluster.results`, built by the core.
"""
