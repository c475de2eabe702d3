"""The config schema: the single source of defaults, registered with Hydra's ConfigStore.

Hydra composes `conf/config.yaml` on top of `RunConfig`, so a misspelled key or a bad Enum value fails at
composition with its full key and the valid values. Below the CLI, code sees only these dataclasses (frozen with
`OmegaConf.to_object`) and plain dicts for the `_target_` nodes: never a DictConfig.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from pathlib import Path
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
    checkpoint (as `torchrun --max-restarts` does for a run it started)."""


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
    """Show a console progress bar on the main process."""
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
    verify: bool = True
    """Before resuming, check every file's sha256 against the manifest (sizes are always checked)."""
    export: bool = True
    """Write <run dir>/export/final.safetensors and best.safetensors (weights only, loadable without the
    runner) with export/config.yaml, the resolved config."""
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
    """Callbacks by name, one target node each (runner/callbacks.py has the hooks), filled by the config group list
    `callbacks=[early_stopping,ema]` (conf/callbacks/); a setting as callbacks.early_stopping.patience=5, one of
    your own as +callbacks.mine._target_=mylab.callbacks.Mine."""
    resume: Optional[str] = None
    """Continue a run: `auto` (the newest intact checkpoint of this run dir, or start from scratch when there is
    none; continue in place with hydra.run.dir=<run dir>), a run dir (its newest intact checkpoint), or one
    checkpoints/step_N directory. None: a fresh run, refused in a run dir that already holds checkpoints."""
    allowed_targets: List[str] = field(
        default_factory=lambda: ["runner.", "torch.", "datasets.", "transformers.", "timm.", "torchvision."]
    )
    """Module prefixes a `_target_` may come from; add your own package (e.g. "mylab.") to use its classes."""


def register_configs() -> None:
    """Register the schema so `conf/config.yaml` can list `runner_schema` first in its defaults, and the
    resolvers: `runner_direction` (the search configs optimize in the direction of `trainer.monitor_mode`), the
    two that give all torchrun ranks one run dir and each its own Hydra log file, and `runner.in_run_dir`.
    Hydra and OmegaConf are imported here, not with the module: `from runner import Accelerator` needs neither."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name="runner_schema", node=RunConfig)
    if not OmegaConf.has_resolver("runner_direction"):
        OmegaConf.register_new_resolver("runner_direction", optuna_direction)
    if not OmegaConf.has_resolver("runner.rank_suffix"):
        OmegaConf.register_new_resolver("runner.rank_suffix", _rank_suffix)
    if not OmegaConf.has_resolver("runner.launcher_run_id"):
        OmegaConf.register_new_resolver("runner.launcher_run_id", _launcher_run_id)
    if not OmegaConf.has_resolver("runner.in_run_dir"):
        OmegaConf.register_new_resolver("runner.in_run_dir", _in_run_dir)
    if not OmegaConf.has_resolver("runner.dir_suffix"):
        OmegaConf.register_new_resolver("runner.dir_suffix", dir_suffix)
    if not OmegaConf.has_resolver("runner.slurm_request"):
        OmegaConf.register_new_resolver("runner.slurm_request", _slurm_request)


def _slurm_request(what: str, kind: Any, num_processes: Any, threads_per_process: Any) -> Any:
    """conf/hydra/launcher/slurm.yaml: a trial's CPUs, memory and GPUs from the hardware group (runner/slurm.py)."""
    from runner.slurm import slurm_request

    return slurm_request(what, kind, num_processes, threads_per_process)


def optuna_direction(mode: MonitorMode | str) -> str:
    """`${runner_direction:${trainer.monitor_mode}}` -> maximize / minimize, as Optuna's sweeper spells them."""
    return "maximize" if MonitorMode(mode) == MonitorMode.max else "minimize"


def _launcher_run_id(default: str) -> str:
    """The id every rank of one torchrun launch shares (so they agree on one run dir), else `default`."""
    from runner.dist import external_run_id

    return external_run_id() or default


def _in_run_dir(name: str) -> Optional[str]:
    """`${runner.in_run_dir:tokenizer}` -> "<this run's dir>/tokenizer" (where a data factory saves what the run
    needs later, e.g. its trained tokenizer); None where no Hydra run is going on (a config composed in a test)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        output_dir = HydraConfig.get().runtime.output_dir
    except Exception:  # HydraConfig not set, or runtime.output_dir missing: not inside a run
        return None
    return str(Path(output_dir).resolve() / name)


def dir_suffix(name: Optional[str]) -> str:
    """`${runner.dir_suffix:${logging.name}}` -> "_<name>" made safe as one path component, "" without a name."""
    import re

    if not name:
        return ""
    return "_" + re.sub(r"[^A-Za-z0-9._=+-]+", "-", str(name)).strip("-.")[:80]


def _rank_suffix() -> str:
    """"_rank<N>" in a process started by torchrun (or SLURM via torchrun), "" otherwise."""
    from runner.dist import external_rank

    rank = external_rank()
    return "" if rank is None else f"_rank{rank}"


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
    """runner.devices.Hardware: where the run executes (None until the parent resolved it)."""
    batch: Any = None
    """runner.plan.BatchPlan: the global batch, its share per device and the accumulation."""
    resume_from: Optional[str] = None
    """The verified checkpoint `resume` resolved to in the parent (None: start from scratch)."""


# A group swapped on the command line: the recipe's keys for it were written for the recipe's own choice.


@dataclass(frozen=True)
class GroupSwap:
    """A config group the command line set to something other than what the recipe chose."""

    group: str
    recipe_choice: Optional[str]
    chosen: Optional[str]
    dropped: List[str]
    """The recipe's keys under the group that were removed (or set back to the chosen option's own value)."""

    def describe(self, recipe: str) -> str:
        return (f"{self.group}={self.chosen} on the command line replaces the {self.recipe_choice} of recipe "
                f"{recipe}: its {', '.join(self.dropped)} (written for {self.recipe_choice}) "
                f"{'is' if len(self.dropped) == 1 else 'are'} dropped")


def drop_swapped_group_keys(cfg: Any, choices: Dict[str, Any], overrides: List[str], config_dirs: List[str],
                            config_name: str = "config") -> List[GroupSwap]:
    """Remove from `cfg` (in place) the recipe's keys under each group the command line swapped.

    A recipe written for the warmup_cosine schedule sets scheduler.warmup_steps; `scheduler=none` asks for a
    constant learning rate, and that key would be left over on a null node, meaning nothing. The same holds for
    any group: keys the recipe set for its own choice are dropped, those the chosen option sets itself come back
    to its value, and keys set on the command line (scheduler.warmup_steps=5) are kept."""
    from omegaconf import open_dict

    recipe = choices.get("recipe")
    recipe_file = _find_config(config_dirs, "recipe", recipe)
    if recipe_file is None:
        return []
    recipe_body, recipe_choices = _read_config(recipe_file)
    primary = _find_config(config_dirs, None, config_name)
    default_choices = _read_config(primary)[1] if primary else {}
    swaps = []
    for group in _groups_chosen_on_command_line(overrides):
        recipe_choice = recipe_choices.get(group, default_choices.get(group))
        chosen = choices.get(group)
        recipe_node = recipe_body.get(group)
        if chosen == recipe_choice or not isinstance(recipe_node, dict):
            continue
        node = cfg.get(group)
        if node is None or not hasattr(node, "keys"):
            continue
        own_node = _group_node(config_dirs, group, chosen)
        dropped = []
        with open_dict(cfg):
            for key in recipe_node:
                if _set_on_command_line(f"{group}.{key}", overrides) or key not in node:
                    continue
                if isinstance(own_node, dict) and key in own_node:
                    node[key] = own_node[key]
                else:
                    del node[key]
                dropped.append(f"{group}.{key}")
            if own_node is None and len(node) == 0:
                cfg[group] = None
        if dropped:
            swaps.append(GroupSwap(group, recipe_choice, chosen, dropped))
    return swaps


def _groups_chosen_on_command_line(overrides: List[str]) -> List[str]:
    """`scheduler=none`, `+model=mine`: a group name (no dots) on the left of `=`."""
    groups = []
    for item in overrides:
        key, equals, _ = item.partition("=")
        key = key.lstrip("+~")
        if equals and key and "." not in key and "@" not in key and "/" not in key and key not in groups:
            groups.append(key)
    return groups


def _set_on_command_line(key: str, overrides: List[str]) -> bool:
    for item in overrides:
        name = item.partition("=")[0].lstrip("+~")
        if name == key or name.startswith(key + ".") or name.startswith(key + "["):
            return True
    return False


def _find_config(config_dirs: List[str], group: Optional[str], name: Optional[str]) -> Optional[Path]:
    """The first file on Hydra's search path for `group/name.yaml` (as Hydra picks it)."""
    if not name:
        return None
    for folder in config_dirs:
        path = Path(folder) / (group or "") / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def _read_config(path: Path) -> tuple:
    """(the file's body without its defaults, {group: option} from its defaults list)."""
    import yaml

    try:
        body = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}, {}
    if not isinstance(body, dict):
        return {}, {}
    chosen = {}
    for entry in body.pop("defaults", None) or []:
        if isinstance(entry, dict):
            for name, option in entry.items():
                name = str(name).replace("override ", "").replace("optional ", "").strip().lstrip("/")
                if "@" not in name:
                    chosen[name] = None if option is None else str(option)
    return body, chosen


def _group_node(config_dirs: List[str], group: str, option: Optional[str]) -> Any:
    """What the option's file puts under the group's key (None for a file that sets it to null, or no file)."""
    path = _find_config(config_dirs, group, option)
    if path is None:
        return None
    body, _ = _read_config(path)
    first_line = path.read_text(encoding="utf-8").split("\n", 1)[0]
    return body.get(group) if "@package _global_" in first_line else body


def group_default_origin(key: str, target: Any, choices: Dict[str, Any], config_dirs: List[str]) -> Optional[Path]:
    """The group option's file that put `key` (model.vocab_size) into a node whose `_target_` is no longer that
    file's own: a recipe that sets model._target_ to the user's class without `override /model: null` keeps the
    default option's keys under it."""
    group, _, rest = key.partition(".")
    name = rest.split(".")[0].split("[")[0]
    option = choices.get(group)
    node = _group_node(config_dirs, group, option)
    if isinstance(node, dict) and name in node and node.get("_target_") != target:
        return _find_config(config_dirs, group, option)
    return None
