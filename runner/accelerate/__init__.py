"""Layer 4, accelerate: the public Accelerator (`accelerator`) and what `prepare` hands back (`prepared`,
`dataloader` over `sharding`), with precision, the parallel wrappers (`parallel`, `memory`), collectives,
Accelerate's option objects (`options`), trackers, save_state/load_state (`saved_state`) and XLA (`xla`).

Usable alone in a hand-written loop: nothing here knows the config groups, the loop or the launcher.
`from runner import Accelerator` is the public name; this package's `__init__` imports nothing, so importing one
of its modules does not load the others."""
