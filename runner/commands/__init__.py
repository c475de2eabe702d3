"""Layer 9, commands: what a user types. `cli` (`python -m runner` and `runner`: a run, a Hydra sweep, or
`runner WORD` dispatched to the modules below), `plan`, `recipes`, `machine`, `sample`, `env`; `runner launch` is
runner/launch's. Nothing imports this package."""
