"""Running HLO on XLA:CPU: compile, execute, compare outputs, random inputs, per-device shards, and making XLA-optimized or XLA:GPU-stage modules runnable on XLA:CPU again."""
