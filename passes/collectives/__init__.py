"""Passes that move collectives across while loops: collective-pipeliner and while-loop-all-reduce-code-motion (XLA's `xla/hlo/transforms/collectives/`)."""
