"""Trace -> metrics, tables, plots (the only package that imports matplotlib)."""
