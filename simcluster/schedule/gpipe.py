"""GPipe: every forward, then every backward (Huang et al. 2019, arXiv 1811.06965;
Megatron's interleaved schedule, `forward_backward_pipelining_with_interleaving`, with
m == p degenerates to this all-warm-up shape)."""

from __future__ import annotations

from simcluster.schedule.ordering import Schedule
from simcluster.schedule.tasks import Phase, Task
from simcluster.schedule.validation import require_positive


def gpipe(num_stages: int, num_microbatches: int, num_chunks: int = 1) -> Schedule:
    """Per-stage order: all forwards, chunk by chunk in virtual-stage order and
    microbatch-major within a chunk, then all backwards in exactly the reverse order.

    Every stage holds all m·v chunk activations at the end of the forwards, so peak
    in-flight is m·v; the bubble fraction is (p − 1)/m for v = 1.
    """
    require_positive("num_stages", num_stages)
    require_positive("num_microbatches", num_microbatches)
    require_positive("num_chunks", num_chunks)
    forwards = [
        Task(Phase.FORWARD, mb, chunk) for chunk in range(num_chunks) for mb in range(num_microbatches)
    ]
    backwards = [Task(Phase.BACKWARD, t.microbatch, t.chunk) for t in reversed(forwards)]
    stage_tasks = tuple(forwards + backwards)
    return tuple(stage_tasks for _ in range(num_stages))


def gpipe_warmup(num_microbatches: int, num_chunks: int) -> int:
    """GPipe's warm-up is every forward: m·v chunk-forwards before the first backward."""
    require_positive("num_microbatches", num_microbatches)
    require_positive("num_chunks", num_chunks)
    return num_microbatches * num_chunks
