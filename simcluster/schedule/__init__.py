"""Pipeline schedules: (pp, vpp, microbatches) -> per-stage ordered tasks. Pure.

Megatron's non-interleaved 1F1B, interleaved 1F1B (Megatron-core `pipeline_parallel/schedules.py`) and GPipe,
the dependency chain between stages, and two analyses: the peak number of stashed
chunk-forwards and the ideal (communication-free) makespan.
"""

from simcluster.schedule.build import (
    build_schedule,
    ep_overlap_extra_warmup,
    unpaired_positions,
    warmup_microbatches,
)
from simcluster.schedule.comm import CommPoints, default_comm_points, interleaved_comm_points
from simcluster.schedule.dependencies import (
    StagedTask,
    downstream,
    upstream,
    upstream_virtual,
    virtual_stage,
)
from simcluster.schedule.gpipe import gpipe
from simcluster.schedule.in_flight import in_flight_counts, peak_in_flight
from simcluster.schedule.interleaved import interleaved_one_f_one_b
from simcluster.schedule.makespan import ScheduleDeadlockError, ideal_makespan
from simcluster.schedule.one_f_one_b import one_f_one_b
from simcluster.schedule.ordering import Schedule, StageTasks
from simcluster.schedule.tasks import Phase, Task

__all__ = [
    "CommPoints",
    "default_comm_points",
    "interleaved_comm_points",
    "Phase",
    "Schedule",
    "ScheduleDeadlockError",
    "StageTasks",
    "StagedTask",
    "Task",
    "build_schedule",
    "downstream",
    "ep_overlap_extra_warmup",
    "gpipe",
    "ideal_makespan",
    "in_flight_counts",
    "interleaved_one_f_one_b",
    "one_f_one_b",
    "peak_in_flight",
    "unpaired_positions",
    "upstream",
    "upstream_virtual",
    "virtual_stage",
    "warmup_microbatches",
]
