"""The config schema: the single source of defaults (registered with Hydra's ConfigStore by runner/run/resolvers.py).

Hydra composes `conf/config.yaml` on top of `RunConfig`, so a misspelled key or a bad Enum value fails at
composition with its full key and the valid values. Below the CLI, code sees only these dataclasses (frozen with
`OmegaConf.to_object`) and plain dicts for the `_target_` nodes: never a DictConfig.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any, Dict, List, Optional



class HardwareKind(str, Enum):
    cpu = "cpu"
    gpu = "gpu"
    multi_gpu = "multi_gpu"
    multi_cpu = "multi_cpu"
    tpu = "tpu"
    auto = "auto"


class PrecisionKind(str, Enum):
    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"
    fp8 = "fp8"


class MonitorMode(str, Enum):
    max = "max"
    min = "min"


class NonFinitePolicy(str, Enum):
    stop = "stop"
    skip = "skip"
    ignore = "ignore"


class StartMethod(str, Enum):
    auto = "auto"
    spawn = "spawn"
    fork = "fork"
    forkserver = "forkserver"


class Launcher(str, Enum):
    runner = "runner"
    ray = "ray"


class StopSignal(str, Enum):
    SIGTERM = "SIGTERM"
    SIGUSR1 = "SIGUSR1"
    SIGUSR2 = "SIGUSR2"
    SIGINT = "SIGINT"


@dataclass
class HardwareConfig:
    kind: HardwareKind = HardwareKind.cpu
    """Where the run executes: cpu, gpu (one CUDA device), multi_gpu, multi_cpu (gloo), tpu, auto."""
    num_processes: Optional[int] = None
    """Worker processes on this machine (multi_cpu, multi_gpu). None: one per GPU in gpu_ids (every visible GPU when
    gpu_ids is null) on multi_gpu, 2 on multi_cpu, 1 otherwise. Ignored under torchrun, which sets its own."""
    threads_per_process: Optional[int] = None
    """CPU threads (torch.set_num_threads) in each worker of a multi-process run. None: this machine's cores divided
    by its worker processes, so N workers do not oversubscribe the cores."""
    start_method: StartMethod = StartMethod.auto
    """How workers are started: auto (fork for CPU processes on Linux, else spawn), spawn (safe everywhere; costs
    seconds per launch: each worker imports torch, Hydra and datasets again), fork (a fraction of a second; CPU
    only: unsafe once CUDA is initialised), forkserver."""
    num_machines: int = 1
    """Machines in the run; each one runs the same command with its own machine_rank."""
    machine_rank: int = 0
    """This machine's index, 0 .. num_machines-1. Machine 0 hosts the rendezvous and global rank 0."""
    main_process_ip: Optional[str] = None
    """Address of machine 0, reachable from every machine (required when num_machines > 1)."""
    main_process_port: Optional[int] = None
    """A free TCP port on machine 0 for the rendezvous (required when num_machines > 1; one machine: a free port
    is picked, so two runs at once never collide)."""
    timeout_s: int = 600
    """Seconds a rank waits for its peers (to join the rendezvous, or in a collective) before the run fails."""
    shutdown_timeout_s: int = 10
    """Seconds workers get to exit after SIGTERM before they are killed (when a rank failed, its peers end
    themselves within about a second anyway)."""
    max_restarts: int = 0
    """Restart this machine's workers up to N times when one fails; each restart continues from the newest intact
    checkpoint (as `torchrun --max-restarts` does for a run it started). With launcher=ray: Ray Train's
    FailureConfig(max_failures=N)."""
    launcher: Launcher = Launcher.runner
    """Who starts the workers of a multi_cpu / multi_gpu run: runner (torch's elastic launcher, on this machine or
    on each of hardware.num_machines), or ray (Ray Train's TorchTrainer, num_processes workers placed by the Ray
    cluster at hardware.ray_address; the `ray` extra)."""
    ray_address: Optional[str] = None
    """launcher=ray: the cluster to join, as ray.init(address=...) takes it ("auto": the one `ray start` runs on
    this machine; "ray://head:10001"). None: the cluster RAY_ADDRESS names (`ray job submit` sets it), else a Ray
    instance of its own on this machine for the run."""


class ParallelKind(str, Enum):
    ddp = "ddp"
    fsdp = "fsdp"
    none = "none"


@dataclass
class ParallelConfig:
    """How several processes share the work: DDP's settings as torch.nn.parallel.DistributedDataParallel takes them,
    then FSDP's (torch.distributed.fsdp.fully_shard)."""

    kind: ParallelKind = ParallelKind.ddp
    """ddp: every process holds the whole model, gradients are averaged; fsdp: each process holds 1/N of the
    parameters, gradients and optimizer state, and gathers each block's parameters only while it computes with
    them (checkpoints are sharded: torch.distributed.checkpoint); none: one process only."""
    find_unused_parameters: bool = False
    """Set when some parameters get no gradient in a step (branches the forward skips): DDP then looks for them
    each step, which costs time; without it such a model fails on several processes."""
    static_graph: bool = False
    """The set of used parameters never changes between steps: DDP can optimise for it (and it also allows
    unused parameters, and activation checkpointing)."""
    gradient_as_bucket_view: bool = False
    """Gradients are views into DDP's all-reduce buckets: saves one copy of the gradients' memory."""
    bucket_cap_mb: Optional[float] = None
    """Size of DDP's gradient buckets in MiB (None: torch's default, 25)."""
    broadcast_buffers: bool = True
    """Copy rank 0's buffers (e.g. BatchNorm statistics) to every rank at each forward."""
    shard_modules: Optional[List[str]] = None
    """fsdp: class names of the modules sharded as one unit each, e.g. [Block] (a unit's parameters are gathered for
    its forward and backward, then freed). None: every block of each nn.ModuleList in the model (a transformer's
    layers). The whole model is always the last unit, holding what the blocks do not."""
    reshard_after_forward: bool = True
    """fsdp: free each unit's gathered parameters after its forward and gather them again for backward (less
    memory); false keeps them from forward to backward (one all-gather less per unit and step)."""
    cpu_offload: bool = False
    """fsdp on GPUs: keep the parameter, gradient and optimizer-state shards in CPU memory and step the optimizer
    there (far less GPU memory, much slower steps)."""


@dataclass
class ActivationCheckpointingConfig:
    enabled: bool = False
    """Recompute each block's activations in backward instead of keeping them from forward: less memory (about
    one block's activations instead of all of them), about one more forward per step."""
    modules: Optional[List[str]] = None
    """Class names of the blocks to checkpoint, e.g. [Block]. None: every block of each nn.ModuleList."""


@dataclass
class CompileConfig:
    enabled: bool = False
    """torch.compile the model (under parallel=fsdp: each sharded block, as torchtitan does). The first steps
    are slow while it compiles; checkpoints and exports keep the model's own parameter names."""
    backend: str = "inductor"
    """torch.compile's backend: inductor (generated kernels; on a CPU it needs a C++ compiler), aot_eager or
    eager (no code generation: to check that the model compiles)."""
    mode: Optional[str] = None
    """torch.compile's mode: default, reduce-overhead (CUDA graphs), max-autotune, max-autotune-no-cudagraphs
    (None: default)."""
    fullgraph: bool = False
    """Fail when the model cannot be captured as one graph (graph breaks) instead of running the rest eagerly."""


@dataclass
class PrecisionConfig:
    kind: PrecisionKind = PrecisionKind.fp32
    """fp32, bf16 (autocast), fp16 (autocast + gradient scaler), fp8 (torchao float8 training)."""
    fp8_emulation: bool = False
    """Allow fp8 without a CUDA device of compute capability >= 8.9. Slow: only to test the code path."""


@dataclass
class TrainerConfig:
    max_epochs: int = 1
    """Epochs to train. The run stops at whichever of max_epochs / max_steps comes first."""
    max_steps: Optional[int] = None
    """Optimizer steps to train (None: no step limit)."""
    batch_size: int = 32
    """The global batch: samples in one optimizer step, over every process and accumulation step together. The
    runner divides it among the processes (and into micro-batches), so the same recipe trains the same way on any
    hardware; a batch the processes cannot share evenly is refused."""
    micro_batch_size: Optional[int] = None
    """The most samples one device takes in one forward pass (for memory): a larger per-device share is split
    into that many accumulated micro-batches. None: no cap."""
    per_device_batch_size: Optional[int] = None
    """The per-device meaning instead: each process draws this many samples per micro-batch, and the global batch
    becomes per_device_batch_size x processes x grad_accum_steps (so it grows with the hardware). When set,
    batch_size and micro_batch_size are not used."""
    eval_batch_size: Optional[int] = None
    """Samples per evaluation batch on each device (None: the training micro-batch)."""
    eval_every_steps: Optional[int] = None
    """Evaluate every N optimizer steps (None: at the end of each epoch). The run always ends with an evaluation."""
    log_every_steps: int = 10
    """Read the loss from the device and log it every N optimizer steps."""
    grad_accum_steps: Optional[int] = None
    """Micro-batches accumulated per optimizer step. None: as few as micro_batch_size allows (1 without a cap)."""
    max_grad_norm: Optional[float] = None
    """Clip the global gradient norm to this value (None: no clipping)."""
    monitor: str = "val/accuracy"
    """The metric the run returns to Hydra (and sweepers), e.g. val/accuracy or val/loss."""
    monitor_mode: MonitorMode = MonitorMode.max
    """Whether a larger (max) or smaller (min) monitored value is better."""
    progress_bar: bool = True
    """Show the progress on the main process's console: a bar on a terminal; where stderr is not a terminal (a
    batch job's log file, nohup, a pipe), a log line every progress_every_s seconds instead."""
    progress_every_s: float = 30.0
    """Away from a terminal, how often the progress line is written (a bar would add each redraw to the file)."""
    data_in_memory_mb: int = 4096
    """Splits up to this size are materialised as tensors once (fastest); larger ones stream Arrow batches."""
    on_nonfinite: NonFinitePolicy = NonFinitePolicy.stop
    """When the training loss becomes NaN or infinite: stop (at the next log step, keeping the last good
    checkpoint, exit 1), skip (skip each optimizer step whose gradients are not finite; costs one host-device
    sync per step), or ignore. Under fp16 the gradient scaler's own skipped steps never count."""
    limit_train_batches: Optional[int] = None
    """Train on at most this many micro-batches per epoch (None: the whole split), at least one optimizer step's
    worth (the accumulation). For quick checks."""
    limit_val_batches: Optional[int] = None
    """Evaluate on at most this many batches per process (None: the whole validation split)."""
    overfit_batches: Optional[int] = None
    """Train on the first N global micro-batches of the training split only, unshuffled, and evaluate on those same
    samples: a model that cannot overfit them has a bug (None: off)."""
    fast_dev_run: Optional[int] = None
    """A debug run (what `debug=fast` sets): N train and N eval batches, then stop; no checkpoints, exports,
    metrics files or loggers: the run dir holds only the log (None: off)."""
    deterministic: bool = False
    """torch.use_deterministic_algorithms(True) (and cuDNN benchmark off, CUBLAS_WORKSPACE_CONFIG set): the same
    seed gives bitwise the same run on the same hardware. Costs speed on GPUs (slower kernels, no cuDNN autotune),
    and an operation without a deterministic kernel raises instead of running."""


@dataclass
class CheckpointConfig:
    enabled: bool = True
    """Write checkpoints into <run dir>/checkpoints."""
    every_epoch: bool = True
    """Save at the end of every epoch (the run always saves at its end)."""
    every_n_steps: Optional[int] = None
    """Also save every N optimizer steps (None: only at epoch ends and at the end)."""
    keep_last: Optional[int] = 3
    """Keep only the K newest checkpoints, plus the keep_best ones (None: keep every checkpoint). Three, so a
    20-epoch run does not fill the disk with 20 copies, while a checkpoint spoiled by a crash still has older
    ones behind it."""
    keep_best: int = 0
    """Also keep the K checkpoints with the best trainer.monitor value (trainer.monitor_mode says which is better).
    When K > 0, a checkpoint is also saved after every evaluation, the only time the metric is known."""
    dir: Optional[str] = None
    """Also keep checkpoints and exports on object storage: a URL such as s3://bucket/prefix (gs://, az://,
    file://: any fsspec URL), holding checkpoints/ and export/. Each checkpoint is sealed in the run dir first, then
    uploaded with its manifest last (the commit); resume=auto fetches the newest committed one from there. Logs and
    metrics stay in the run dir. S3 needs the s3 extra; credentials and endpoint come from the environment."""
    verify: bool = True
    """Before resuming, check every file's sha256 against the manifest (sizes are always checked)."""
    export: bool = True
    """Write <run dir>/export/final.safetensors and best.safetensors (weights only, loadable without the
    runner) with export/config.yaml, the resolved config."""
    init_from: Optional[str] = None
    """Start a new run from these weights: a .safetensors file (another run's export/final.safetensors), a
    checkpoints/step_N dir or a run dir (its export/final.safetensors). The model only: the optimizer, the schedule,
    the step count and the data order start fresh. A run that resumes from its own checkpoint takes that one's
    weights instead, so the same command with resume=auto continues a preempted fine-tune."""
    stop_signals: List[StopSignal] = field(default_factory=lambda: [StopSignal.SIGTERM, StopSignal.SIGUSR1])
    """On these signals: finish the current optimizer step, save a checkpoint and exit with code 75, so that
    the same command with resume=auto continues the run. With several processes the ranks agree on stopping
    every trainer.log_every_steps steps, so the stop lands on the next such step. [] leaves every signal's
    default behaviour."""


@dataclass
class LoggingConfig:
    """What names the run and what every run writes; the sinks (TensorBoard, CSV, W&B, MLflow) are the `logger`
    group: `logger=[tensorboard,csv]`."""

    jsonl: bool = True
    """Append one JSON object per logged step to <run dir>/metrics.jsonl: the run's own record, which result.json,
    the sweep report and resume read (kept whatever `logger` lists)."""
    name: Optional[str] = None
    """The run's name: the run dir's suffix (outputs/<date>/<time>_<name>, so TensorBoard's run list shows it) and
    the W&B / MLflow run name (None: no suffix; the trackers get the run dir's folder name)."""
    tags: List[str] = field(default_factory=list)
    """Tags for the run (W&B tags, MLflow tags, TensorBoard's `run` text), e.g. logging.tags=[baseline,cpu]."""
    notes: Optional[str] = None
    """A sentence about the run (W&B notes, MLflow description, TensorBoard's `run` text)."""


@dataclass
class RunConfig:
    """A whole experiment. Recipes (`recipes/*.yaml`) set these keys; the command line overrides them."""

    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    activation_checkpointing: ActivationCheckpointingConfig = field(default_factory=ActivationCheckpointingConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    model: Any = None
    """`_target_` node: the torch.nn.Module to train."""
    optimizer: Any = None
    """`_target_` node with `_partial_: true`: called with the model's parameters."""
    scheduler: Any = None
    """`_target_` node with `_partial_: true`, called with the optimizer (and total_steps if it takes it); or null."""
    data: Any = None
    """`_target_` node returning a datasets.DatasetDict with `train` and `validation` splits."""
    task: Any = None
    """`_target_` node: turns a batch into a loss and metrics."""
    seed: int = 0
    """Seeds python, numpy and torch on every process."""
    gpu_ids: Any = None
    """Which GPUs to use: all, a list like [0,2], or a string like "0,2" (None: all)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    logger: Dict[str, Any] = field(default_factory=dict)
    """The sinks, one `_partial_` target node each, filled by the config group list `logger=[tensorboard,csv]`
    (conf/logger/: tensorboard, csv, wandb, mlflow); `logger=[]` for none (metrics.jsonl is `logging.jsonl`)."""
    callbacks: Dict[str, Any] = field(default_factory=dict)
    """Callbacks by name, one target node each (runner/training/callbacks.py has the hooks), filled by the config group list
    `callbacks=[early_stopping,ema]` (conf/callbacks/); a setting as callbacks.early_stopping.patience=5, one of
    your own as +callbacks.mine._target_=mylab.callbacks.Mine."""
    resume: Optional[str] = None
    """Continue a run: `auto` (the newest intact checkpoint of this run dir, or start from scratch when there is
    none; continue in place with hydra.run.dir=<run dir>), a run dir (its newest intact checkpoint), one
    checkpoints/step_N directory, or the same on object storage (s3://bucket/prefix, another run's checkpoint.dir,
    or .../checkpoints/step_N: downloaded into <run dir>/fetched/). None: a fresh run, refused in a run dir that
    already holds checkpoints."""
    allowed_targets: List[str] = field(
        default_factory=lambda: ["runner.", "torch.", "datasets.", "transformers.", "timm.", "torchvision."]
    )
    """Module prefixes a `_target_` may come from; add your own package (e.g. "mylab.") to use its classes."""


def plain(config: Any) -> Any:
    """A config (or part of one) as plain dicts, lists and scalars, Enums as their values: what config.yaml,
    checkpoints and TensorBoard record. Derived where it is written, from the one typed config."""
    if is_dataclass(config):
        return {item.name: plain(getattr(config, item.name)) for item in fields(config)}
    if isinstance(config, Enum):
        return config.value
    if isinstance(config, dict):
        return {key: plain(value) for key, value in config.items()}
    if isinstance(config, (list, tuple)):
        return [plain(value) for value in config]
    return config


@dataclass(frozen=True)
class RunSpec:
    """What a worker process receives: the typed config, what the parent resolved from it on this machine (the
    hardware and the batch plan), and the absolute run dir. Picklable, so the elastic launcher can hand it to
    each rank."""

    config: RunConfig
    run_dir: str
    hardware: Any = None
    """runner.distributed.devices.Hardware: where the run executes (None until the parent resolved it)."""
    batch: Any = None
    """runner.training.batch_plan.BatchPlan: the global batch, its share per device and the accumulation."""
    resume_from: Optional[str] = None
    """The verified checkpoint `resume` resolved to in the parent (None: start from scratch)."""
