"""Layer 6, training: the standard loop (`loop`) and what plugs into it: callbacks, loggers and the metrics they
share, tasks, schedules, the loop's checkpointer (when to save, what to keep, what to export), the batch plan,
debug limits and the run summary.

The loop builds nothing and reads no config file: the run layer above builds the parts and hands them over.
Recipes name the public modules `runner.callbacks`, `runner.loggers`, `runner.tasks`, `runner.hf_tasks` and
`runner.schedules`, which forward here."""
