"""`runner plan OVERRIDES` (also `python -m runner plan`): what a run would hold per process, said before it runs."""

from __future__ import annotations

from pathlib import Path


USAGE = ("usage: runner plan [OVERRIDES]   what the run these overrides describe would hold per process (weights, "
         "gradients, optimizer state, batch), its FLOPs, step time and checkpoint time, without training")


def describe_run(spec) -> str:
    """What `spec` (runner.run.compose.load's RunSpec) would train, per process: the model built on the meta device,
    its weights, gradients and optimizer state for the parallel setting and precision (runner/accelerate/memory.py),
    the batch, the steps, whether it fits the memory of the devices present, the FLOPs of a step and the least time
    they take on this machine's device (counted on one batch of the data), and how long saving a
    checkpoint takes at the write speed measured where the run dir will be."""
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
             "optimizer steps (`runner recipes validate NAME` counts them)")
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
        _step_time(spec, model_node),
        _save_time(memory.weight_bytes + memory.optimizer_bytes, Path(spec.run_dir)),
    ])


def _step_time(spec, model_node) -> str:
    """The FLOPs of one optimizer step per process (counted as the run counts them, runner/training/throughput.py,
    on the model built on the meta device and one batch of the data) and the least time they take at the peak
    of this machine's device for the run's precision (runner/distributed/peak.py). Generated data is built with
    one batch of rows; data from files is read as a run reads it."""
    import torch

    from runner.config.instantiate import build_data, build_model, build_task
    from runner.data.batches import make_batches
    from runner.distributed.dist import DistInfo, threads_per_process
    from runner.distributed.peak import device_peak
    from runner.errors import first_line
    from runner.training.throughput import count_flops_per_sample, human_flops

    config, hardware, batch = spec.config, spec.hardware, spec.batch
    # One batch is all the count needs: generated data (data.num_train) is made that small, not at full size.
    data = dict(config.data)
    for key in ("num_train", "num_validation"):
        if isinstance(data.get(key), int):
            data[key] = min(data[key], batch.per_device)
    try:
        train = build_data(data)["train"]
        first = next(iter(make_batches(train, batch.per_device, False, config.seed, config.trainer.data_in_memory_mb)))
    except Exception as err:  # noqa: BLE001 - the plan's other lines stand; the run itself reports data errors
        return f"step time: unknown, the data to count a step's FLOPs on could not be built ({first_line(err)})"
    with torch.device("meta"):
        model = build_model(model_node)
    per_sample, counted = count_flops_per_sample(model, build_task(config.task), first)
    if per_sample is None:
        return f"step time: unknown, FLOPs {counted}"
    per_step = per_sample * batch.global_batch / batch.processes
    device = {"cuda": torch.device("cuda", 0)}.get(hardware.device_type, torch.device(hardware.device_type))
    if hardware.device_type == "cuda" and not torch.cuda.is_available():
        return f"step time: {human_flops(per_step)} per process per optimizer step; no CUDA GPU here to time it on"
    threads = torch.get_num_threads()
    if hardware.device_type == "cpu":  # the threads each of the run's processes will have: the workers' own rule
        planned = threads_per_process(DistInfo(local_world_size=hardware.processes_per_machine),
                                      hardware.threads_per_process)
        torch.set_num_threads(planned or threads)
    try:
        peak = device_peak(device, config.precision.kind.value)
    finally:
        torch.set_num_threads(threads)
    if not peak.flops_per_s:
        return f"step time: {human_flops(per_step)} per process per optimizer step; {peak.source}"
    return (f"step time: {human_flops(per_step)} per process per optimizer step ({human_flops(per_sample)} per "
            f"sample, {counted}) -> at least {per_step / peak.flops_per_s * 1e3:.3g} ms at the device's peak of "
            f"{human_flops(peak.flops_per_s)}/s ({peak.source}); the run logs train/mfu, the share of that peak "
            "it reaches")


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

    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    try:
        print(describe_run(load(arguments)))
    except RunnerError as err:
        exit_with(err)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
