"""simcluster: a discrete-event simulator of Megatron-style transformer training.

Predicts iteration time, MFU/HFU and per-stage memory under tensor, sequence, pipeline and
data parallelism with none / selective / full activation recomputation (Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models", MLSys 2023).
"""

__version__ = "0.1.0"
