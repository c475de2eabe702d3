"""Layer 7, run: one run assembled from its config, before and around training. `compose` (Hydra composition,
freezing into the typed RunConfig, the run's one-time decisions: hardware, batch plan, resume point, config.yaml),
`resolvers` (the schema's registration and the `${runner...:}` resolvers), `checks` (every cross-field check, all
problems at once), `slurm` (a SLURM request checked against the partition), `validate` (a config checked as far as
it can be without training), `rundir` (the run dir: one run at a time, and the cleanup of a run that failed before
training), and `wiring` (build the parts of a run from its config, then the loop that trains them)."""
