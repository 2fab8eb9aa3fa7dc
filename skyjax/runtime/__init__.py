"""Stage programs, executors, transports and jax.distributed set-up (import the submodules)."""
