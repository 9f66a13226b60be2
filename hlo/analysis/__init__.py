"""Reusable analyses of HLO modules, one module per analysis as XLA lays them out (xla/hlo/analysis/):

- `hlo_replication_analysis`: which devices hold equal values (ReplicationAnalysis, CollectiveReplication,
  device_config);
- `while_loop_analysis`: a while loop's induction variable, range and trip count (induction_variable,
  loop_range, trip_count, affine_in_induction_variable).

They only read the IR; passes, the cost model and the scheduler share them.
"""

from hlopt.hlo.analysis.hlo_replication_analysis import (
    CollectiveReplication,
    DeviceConfig,
    ReplicationAnalysis,
    collective_group_mode,
    device_config,
    replica_groups,
)
from hlopt.hlo.analysis.while_loop_analysis import (
    LoopRange,
    affine_in_induction_variable,
    induction_variable,
    is_induction_variable,
    loop_max_value,
    loop_range,
    trip_count,
)

__all__ = [
    "CollectiveReplication", "DeviceConfig", "ReplicationAnalysis", "collective_group_mode", "device_config",
    "replica_groups", "LoopRange", "affine_in_induction_variable", "induction_variable", "is_induction_variable",
    "loop_max_value", "loop_range", "trip_count",
]
