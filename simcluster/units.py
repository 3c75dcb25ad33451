"""Unit constants and the converters for units that appear in files.

SI inside the code: seconds, bytes (1 GB = 1e9), FLOP, FLOP/s. This is the only module
that spells out the powers of ten and two.
"""

from __future__ import annotations

BYTES_PER_KB = 1e3
BYTES_PER_MB = 1e6
BYTES_PER_GB = 1e9
BYTES_PER_GIB = 1024**3
BYTES_PER_MIB = 1024**2
FLOP_PER_TFLOP = 1e12
SECONDS_PER_MS = 1e-3
SECONDS_PER_US = 1e-6
BITS_PER_BYTE = 8


def gb_to_bytes(gb: float) -> float:
    return gb * BYTES_PER_GB


def gib_to_bytes(gib: float) -> float:
    return gib * BYTES_PER_GIB


def mib_to_bytes(mib: float) -> float:
    return mib * BYTES_PER_MIB


def bytes_to_gb(num_bytes: float) -> float:
    return num_bytes / BYTES_PER_GB


def bytes_to_gib(num_bytes: float) -> float:
    return num_bytes / BYTES_PER_GIB


def gb_per_s_to_bytes_per_s(gb_per_s: float) -> float:
    return gb_per_s * BYTES_PER_GB


def gbit_per_s_to_bytes_per_s(gbit_per_s: float) -> float:
    return gbit_per_s * BYTES_PER_GB / BITS_PER_BYTE


def tflop_per_s_to_flop_per_s(tflop_per_s: float) -> float:
    return tflop_per_s * FLOP_PER_TFLOP


def flop_per_s_to_tflop_per_s(flop_per_s: float) -> float:
    return flop_per_s / FLOP_PER_TFLOP


def us_to_s(us: float) -> float:
    return us * SECONDS_PER_US


def ms_to_s(ms: float) -> float:
    return ms * SECONDS_PER_MS


def s_to_ms(seconds: float) -> float:
    return seconds / SECONDS_PER_MS
