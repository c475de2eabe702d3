"""`runner plan OVERRIDES` (also `python -m runner plan`): what a run would hold per process, said before it runs."""

from __future__ import annotations


def describe_run(spec) -> str:
    """What `spec` (runner.run.compose.load's RunSpec) would train, per process: the model built on the meta device (no
    data is built, unless the model's sizes come from it), its weights, gradients and optimizer state for the
    parallel setting and precision (runner/accelerate/memory.py), the batch, the steps, and whether it fits the memory of the
    devices present."""
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
    ])


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
