"""`runner plan OVERRIDES` (also `python -m runner plan`): what a run would hold per process, said before it runs."""

from __future__ import annotations

from pathlib import Path


def describe_run(spec) -> str:
    """What `spec` (runner.run.compose.load's RunSpec) would train, per process: the model built on the meta device (no
    data is built, unless the model's sizes come from it), its weights, gradients and optimizer state for the
    parallel setting and precision (runner/accelerate/memory.py), the batch, the steps, and whether it fits the memory of the
    devices present, and how long saving a checkpoint takes at the write speed measured where the run dir will be."""
    import torch

    from runner.config.instantiate import build_data, build_model, build_optimizer
    from runner.data.shapes import fill_from_data, sizes_wanted
    from runner.distributed.devices import memory_per_process
    from runner.accelerate.memory import human, memory_plan

    config, hardware, batch = spec.config, spec.hardware, spec.batch
    model_node = config.model
    if sizes_wanted(model_node):  # sizes the data fills (a table's columns and classes): read its schema
        model_node = fill_from_data(model_node, build_data(config.data)["train"], config.task)
    with torch.device("meta"):
        model = build_model(model_node)
    memory = memory_plan(model, build_optimizer(config.optimizer, model), config.parallel,
                         hardware.world_size, config.precision.kind)
    parts = [f"weights {human(memory.weight_bytes)}", f"gradients {human(memory.gradient_bytes)}",
             f"optimizer state {human(memory.optimizer_bytes)}"]
    if memory.bucket_bytes:
        parts.append(f"DDP gradient buckets {human(memory.bucket_bytes)}")
    if memory.gathered_bytes:
        parts.append(f"gathered while computing {human(memory.gathered_bytes)}")
    trainer = config.trainer
    steps = (f"at most {trainer.max_steps} optimizer steps (trainer.max_steps) within {trainer.max_epochs} epoch(s)"
             if trainer.max_steps else
             f"{trainer.max_epochs} epoch(s), each of (training rows / {batch.global_batch}, the global batch) "
             "optimizer steps (the plan builds no data; `runner recipes validate NAME` counts them)")
    capacity = memory_per_process(hardware)
    if capacity is None:
        fits = f"unknown: the memory of a {hardware.device_type} device is not known here"
    elif memory.total_bytes <= capacity:
        fits = f"yes, {human(memory.total_bytes)} of {human(capacity)} per process, before activations"
    else:
        fits = (f"no: {human(memory.total_bytes)} per process before activations, and a process has "
                f"{human(capacity)}; use parallel=fsdp, more processes, or a smaller model")
    return "\n".join([
        f"plan: parallel {config.parallel.kind.value} on {hardware.world_size} {hardware.device_type} process(es), "
        f"precision {config.precision.kind.value}",
        f"model: {memory.parameters:,} parameters ({type(model).__name__})",
        f"per process: {', '.join(parts)} = {human(memory.total_bytes)}",
        batch.describe(),
        f"steps: {steps}",
        f"fits: {fits}",
        _save_time(memory.weight_bytes + memory.optimizer_bytes, Path(spec.run_dir)),
    ])


PROBE_BYTES = (4 << 20, 64 << 20)
"""How much `runner plan` writes to measure the disk: the checkpoint's size, within these bounds."""


def _save_time(checkpoint_bytes: int, run_dir: Path) -> str:
    """The checkpoint's size per process and the time writing it takes at the write speed measured now, where the
    run dir will be (its nearest existing folder): what an eviction's grace period must cover after a step."""
    from runner.accelerate.memory import human
    from runner.checkpoint.files import write_speed

    where = next(folder for folder in (run_dir.resolve(), *run_dir.resolve().parents) if folder.is_dir())
    speed = write_speed(where, min(max(checkpoint_bytes, PROBE_BYTES[0]), PROBE_BYTES[1]))
    return (f"checkpoint: {human(checkpoint_bytes)} per process (weights and optimizer state); {human(int(speed))}/s "
            f"measured writing to {where} -> about {checkpoint_bytes / speed:.2f} s per save (SIGTERM's grace "
            "period must cover one optimizer step and this)")


def main(argv: list[str] | None = None) -> int:
    import sys

    from runner.run.compose import load
    from runner.errors import RunnerError, exit_with

    try:
        print(describe_run(load(sys.argv[1:] if argv is None else argv)))
    except RunnerError as err:
        exit_with(err)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
