"""hlopt inside JAX: capture a function's HLO, `jit`, the pre-compile `hook`, and XLA's transformation stages the hook's GPU route runs in."""
