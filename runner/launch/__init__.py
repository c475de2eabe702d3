"""Layer 8, launch: the processes of a run. `launcher` (one process in-process, several through torch's elastic
agent, and `python -m runner.launch` for a user's own script), `agent` (the elastic agent run from a thread),
`ray_train` (hardware.launcher=ray: the workers as a Ray Train TorchTrainer), `worker` (one process's run: group, seed, build, prepare, loop), `peers` (what the ranks tell each other through
the store), `failures` (a rank's failure as one readable line), `rank_exec` (how a rank of a user's script is
tied to its launcher), `shutdown` (how a runner process ends).

This `__init__` imports nothing: `python -m runner.launch` runs `__main__`."""
