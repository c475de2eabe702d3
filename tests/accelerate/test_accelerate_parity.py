"""runner.Accelerator against the behaviour Accelerate documents, on 1 process (fast, no launch) and on 2 gloo
processes (one launch, tests/parity_workers.py, each check asserted by its own test below).

The sharding rules are tested on runner/accelerate/sharding.py's objects directly for any process index: they need no group.
"""

from __future__ import annotations

import itertools

import pickle

import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler, TensorDataset

from runner import (
    Accelerator, DataLoaderConfiguration, DistributedType, GradientAccumulationPlugin, GradScalerKwargs,
)
from runner.distributed.dist import DistInfo
from runner.config import ParallelConfig, ParallelKind
from runner.errors import CheckpointError, ConfigError, LaunchError
from runner.accelerate.prepared import AcceleratedScheduler
from runner.accelerate.sharding import BatchShard, IterableShard


def dealt(num_samples: int, batch_size: int, rank: int, num_processes: int = 2, drop_last: bool = False, **kw):
    """The batches (as lists of indices) and real counts process `rank` draws."""
    shard = BatchShard(BatchSampler(SequentialSampler(range(num_samples)), batch_size, drop_last), num_processes,
                       rank, batch_size=batch_size, drop_last=drop_last, **kw)
    batches = [list(batch) for batch in shard]
    assert len(shard) == len(batches)
    return batches, list(shard.reals)


# -- which batches each process draws (Accelerate's BatchSamplerShard rules) ------------------------------------------

def test_whole_batches_are_dealt_in_turn():
    """Two processes together see what one process sees at twice the batch size."""
    assert dealt(8, 2, 0)[0] == [[0, 1], [4, 5]]
    assert dealt(8, 2, 1)[0] == [[2, 3], [6, 7]]


def test_split_batches_cuts_each_batch():
    """split_batches=True cuts each batch among the processes."""
    assert dealt(8, 2, 0, split_batches=True)[0] == [[0], [2], [4], [6]]
    assert dealt(8, 2, 1, split_batches=True)[0] == [[1], [3], [5], [7]]


def test_even_batches_pad_from_the_first_batch():
    """even_batches completes the last global batch from the first batch and counts the real samples."""
    # 11 samples, batches of 2: the last global batch is [8, 9], [10] -> completed with sample 0.
    assert dealt(11, 2, 0) == ([[0, 1], [4, 5], [8, 9]], [None, None, None])
    assert dealt(11, 2, 1) == ([[2, 3], [6, 7], [10, 0]], [None, None, 1])
    # 10 samples: the odd 5th batch makes process 1 take a whole batch of repeats, none real.
    assert dealt(10, 2, 1) == ([[2, 3], [6, 7], [0, 1]], [None, None, 0])
    # Split: the short last batch [4] is completed to 4 from the first batch, then cut in two.
    assert dealt(5, 4, 0, split_batches=True) == ([[0, 1], [4, 0]], [None, 1])
    assert dealt(5, 4, 1, split_batches=True) == ([[2, 3], [1, 2]], [None, 0])


def test_every_process_draws_accelerates_batches():
    """Accelerate's BatchSamplerShard, compared batch by batch over data sizes, batch sizes, process counts and
    settings: the end of an epoch is completed from the first n batches, as Accelerate does (it took only the first
    batch, so on 2 processes rank 1's last batch of 50 samples in 4s was [2, 3, 0, 1] against Accelerate's
    [2, 3, 4, 5], and training on the runner's Accelerator differed from Accelerate's)."""
    from accelerate.data_loader import BatchSamplerShard

    for num, size, n, drop_last, even, split in itertools.product(
            range(1, 30), (1, 2, 3, 4), (2, 3, 4), (False, True), (True, False), (False, True)):
        if split and size % n:
            continue
        for rank in range(n):
            theirs = [list(batch) for batch in BatchSamplerShard(
                BatchSampler(SequentialSampler(range(num)), size, drop_last), n, rank, split_batches=split,
                even_batches=even)]
            ours = [list(batch) for batch in BatchShard(
                BatchSampler(SequentialSampler(range(num)), size, drop_last), n, rank, split, even, size, drop_last)]
            assert ours == theirs, (num, size, n, drop_last, even, split, rank)


def test_uneven_batches_and_drop_last_cut_the_tail():
    """Without even_batches the last processes get fewer samples; drop_last drops the incomplete tail."""
    assert dealt(11, 2, 0, even_batches=False)[0] == [[0, 1], [4, 5], [8, 9]]
    assert dealt(11, 2, 1, even_batches=False)[0] == [[2, 3], [6, 7], [10]]
    assert dealt(11, 2, 1, drop_last=True)[0] == [[2, 3], [6, 7]]


def test_split_batches_refuses_an_indivisible_size():
    """split_batches refuses a batch size that the number of processes does not divide."""
    with pytest.raises(ConfigError) as error:
        dealt(12, 3, 0, split_batches=True)
    assert "DataLoaderConfiguration.split_batches" in str(error.value)
    assert "the loader's is 3; use a batch size that is a multiple of 2" in str(error.value)


class Stream(IterableDataset):
    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


def test_iterable_dataset_is_dealt_sample_by_sample():
    """An iterable dataset is dealt sample by sample, in global batches."""
    shards = [list(IterableShard(Stream(7), 2, 2, rank)) for rank in range(2)]
    # Global batches of 4: [0..3], then [4, 5, 6] completed with sample 0 (not real).
    assert shards[0] == [(0, True), (1, True), (4, True), (5, True)]
    assert shards[1] == [(2, True), (3, True), (6, True), (0, False)]
    assert len(IterableShard(Stream(7), 2, 2, 1)) == 4


# -- the prepared loader on one process -------------------------------------------------------------------------------

def make_loader(n: int = 10, batch_size: int = 2, **kwargs) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(n)), batch_size=batch_size, **kwargs)


def test_accumulate_syncs_at_the_loader_end():
    """accumulate() syncs and steps at the end of the dataloader, even in the middle of a cycle."""
    accelerator = Accelerator("cpu", gradient_accumulation_steps=2)
    model = accelerator.prepare(nn.Linear(1, 1))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = accelerator.prepare(make_loader(10, 2))  # 5 batches: cycles of 2, 2, then the last batch alone
    syncs, ends, steps = [], [], 0
    for (ids,) in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(ids.float().unsqueeze(1)).sum())
            syncs.append(accelerator.sync_gradients)
            ends.append(accelerator.gradient_state.end_of_dataloader)
            steps += accelerator.sync_gradients
            optimizer.step()
            optimizer.zero_grad()
    assert syncs == [False, True, False, True, True]
    assert ends == [False, False, False, False, True]
    assert steps == 3 and not accelerator.gradient_state.in_dataloader
    assert model.weight.grad is None  # the last step ran and zeroed: nothing left over for the next epoch


def test_sync_each_batch_and_the_plugin_give_the_count():
    plugin = GradientAccumulationPlugin(num_steps=3, sync_each_batch=True)
    accelerator = Accelerator("cpu", gradient_accumulation_plugin=plugin)
    assert accelerator.gradient_accumulation_steps == 3 and accelerator.gradient_accumulation_plugin is plugin
    with pytest.raises(ConfigError) as error:
        Accelerator("cpu", gradient_accumulation_steps=2, gradient_accumulation_plugin=plugin)
    assert "Accelerator(gradient_accumulation_plugin)" in str(error.value)
    assert "give the count once" in str(error.value)


def test_key_and_iterable_loaders_are_prepared():
    """A loader with batch_size=None and one over an iterable dataset are both prepared."""
    accelerator = Accelerator("cpu", gradient_accumulation_steps=2)
    # batch_size=None: each key the sampler yields is a whole batch, fetched by the dataset itself.
    by_key = DataLoader(list(torch.arange(12).split(4)), batch_size=None)
    assert [batch.tolist() for batch in accelerator.prepare(by_key)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    stream = accelerator.prepare(DataLoader(Stream(5), batch_size=2))
    assert [batch.tolist() for batch in stream] == [[0, 1], [2, 3], [4]]


def test_seedable_sampler_uses_data_seed_plus_epoch():
    def order(epoch: int) -> list[int]:
        config = DataLoaderConfiguration(use_seedable_sampler=True, data_seed=11)
        loader = Accelerator("cpu", dataloader_config=config).prepare(make_loader(8, 8, shuffle=True))
        loader.set_epoch(epoch)
        return next(iter(loader))[0].tolist()

    assert order(0) == order(0) == torch.randperm(8, generator=torch.Generator().manual_seed(11)).tolist()
    assert order(3) == torch.randperm(8, generator=torch.Generator().manual_seed(14)).tolist()
    loader = Accelerator("cpu", dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=11)
                         ).prepare(make_loader(8, 8, shuffle=True))
    first, second = (next(iter(loader))[0].tolist() for _ in range(2))
    assert first == order(0) and second == order(1)  # each pass is the next epoch, without set_epoch


def test_one_process_loader_shuffles_as_plain():
    """On one process the prepared loader shuffles exactly as the plain loader."""
    torch.manual_seed(5)
    plain = [batch[0].tolist() for _ in range(2) for batch in make_loader(10, 3, shuffle=True)]
    torch.manual_seed(5)
    loader = Accelerator("cpu", gradient_accumulation_steps=2).prepare(make_loader(10, 3, shuffle=True))
    assert [batch[0].tolist() for _ in range(2) for batch in loader] == plain


def test_prepared_loader_skips_batches_and_pickles():
    """skip_first_batches and pickling work on a prepared loader (a plain one is prepared first)."""
    accelerator = Accelerator("cpu", gradient_accumulation_steps=2)
    loader = accelerator.prepare(make_loader(10, 2))
    skipped = accelerator.skip_first_batches(loader, 3)
    assert [batch[0].tolist() for batch in skipped] == [[6, 7], [8, 9]] and len(skipped) == 2
    assert len(loader) == 5 and next(iter(loader))[0].tolist() == [0, 1]
    copied = pickle.loads(pickle.dumps(loader))
    assert [batch[0].tolist() for batch in copied] == [batch[0].tolist() for batch in loader]
    plain = accelerator.skip_first_batches(make_loader(6, 2), 1)  # a loader not prepared is prepared first
    assert [batch[0].tolist() for batch in plain] == [[2, 3], [4, 5]]


def test_gather_for_metrics_of_objects_on_one_process():
    accelerator = Accelerator("cpu")
    assert accelerator.gather_for_metrics(["a", "b"]) == ["a", "b"]
    assert accelerator.gather_for_metrics({"x": torch.tensor([1, 2])})["x"].tolist() == [1, 2]


# -- constructor surface and bad input -------------------------------------------------------------------------------

def test_unsupported_loader_options_are_refused():
    """Unsupported DataLoaderConfiguration options are refused by name; a batch the main process cannot send
    (dispatch_batches=True) is refused naming its type."""
    with pytest.raises(ConfigError) as error:
        DataLoaderConfiguration(use_stateful_dataloader=True)
    assert "DataLoaderConfiguration.use_stateful_dataloader" in str(error.value)
    assert "skip_first_batches" in str(error.value)
    assert DataLoaderConfiguration(dispatch_batches=False).dispatch_batches is False
    dispatching = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    words = dispatching.prepare(DataLoader(["a", "b"], batch_size=2))
    with pytest.raises(TypeError, match=r"dispatch_batches=True\): a batch holds a str; .* Use dispatch_batches=False"):
        next(iter(words))
    dispatching.xla = object()  # what an XLA device sets; the refusal comes before anything uses it
    with pytest.raises(ConfigError, match=r"dispatch_batches: True is not supported on XLA devices"):
        dispatching.prepare(DataLoader(range(4)))


def test_unknown_trackers_and_handlers_are_refused():
    """log_with naming other trackers, unknown kwargs_handlers and tensorboard without a project_dir are refused."""
    with pytest.raises(ConfigError) as error:
        Accelerator("cpu", log_with="wandb")
    assert "Accelerator(log_with)" in str(error.value) and "['wandb']" in str(error.value)
    with pytest.raises(ConfigError) as error:
        Accelerator("cpu", kwargs_handlers=[object()])
    assert "Accelerator(kwargs_handlers)" in str(error.value) and "GradScalerKwargs" in str(error.value)
    with pytest.raises(ConfigError) as error:
        Accelerator("cpu", log_with="tensorboard").init_trackers("run")
    assert "Accelerator(project_dir)" in str(error.value)


def test_grad_scaler_kwargs_set_the_fp16_scaler():
    accelerator = Accelerator("cpu", "fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024, growth_interval=7)])
    assert accelerator.scaler.get_scale() == 1024.0 and accelerator.scaler._growth_interval == 7
    assert Accelerator("cpu", kwargs_handlers=[GradScalerKwargs(init_scale=8)]).scaler is None  # fp32: no scaler


def test_ddp_kwargs_set_ddp_or_are_refused():
    """DDP kwargs set DDP's settings, and are refused where they would be dropped (fsdp, none, a ParallelConfig)."""
    from runner import DistributedDataParallelKwargs

    handler = DistributedDataParallelKwargs(find_unused_parameters=True, bucket_cap_mb=5)
    for parallel in (None, "ddp", ParallelKind.ddp):
        settings = Accelerator("cpu", parallel=parallel, kwargs_handlers=[handler]).parallel
        assert settings.kind == ParallelKind.ddp and settings.find_unused_parameters and settings.bucket_cap_mb == 5
    for parallel, says in (("fsdp", "parallel is 'fsdp', which does not use them"),
                           ("none", "parallel is 'none', which does not use them"),
                           (ParallelConfig(), "a DistributedDataParallelKwargs and a ParallelConfig both set")):
        with pytest.raises(ConfigError) as error:
            Accelerator("cpu", parallel=parallel, kwargs_handlers=[handler])
        assert str(error.value).startswith("bad config: Accelerator(kwargs_handlers): ") and says in str(error.value)


def test_cpu_true_state_and_distributed_type():
    accelerator = Accelerator(cpu=True)
    assert accelerator.device == torch.device("cpu") and accelerator.distributed_type == DistributedType.NO
    assert accelerator.state.num_processes == 1 and accelerator.state.distributed_type == "NO"
    two = Accelerator("cpu", dist=DistInfo(rank=1, local_rank=1, world_size=2))
    assert two.distributed_type == DistributedType.MULTI_CPU and two.use_distributed


def test_scheduler_steps_once_per_process_per_step():
    """Steps num_processes times per optimizer step, unless split_batches or step_scheduler_with_optimizer=False."""
    def stepped(**kwargs) -> int:
        accelerator = Accelerator("cpu", dist=DistInfo(rank=0, world_size=2), **kwargs)
        optimizer = accelerator.prepare(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0))
        scheduler = accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1))
        for _ in range(3):
            optimizer.step()
            scheduler.step()
        return scheduler.last_epoch, type(scheduler)

    assert stepped() == (6, AcceleratedScheduler)  # Accelerate's convention: 2 processes, 2 steps per step
    assert stepped(dataloader_config=DataLoaderConfiguration(split_batches=True))[0] == 3
    assert stepped(step_scheduler_with_optimizer=False) == (3, torch.optim.lr_scheduler.StepLR)


def test_one_cycle_stops_at_its_total_steps():
    """OneCycleLR stops at its total steps when stepped num_processes times per optimizer step."""
    accelerator = Accelerator("cpu", dist=DistInfo(rank=0, world_size=2))
    optimizer = accelerator.prepare(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0))
    scheduler = accelerator.prepare(torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1.0, total_steps=5))
    for _ in range(4):  # 8 steps asked of a 5-step schedule: no "Tried to step ... times" error
        optimizer.step()
        scheduler.step()
    assert scheduler.scheduler._step_count == 6  # its constructor's step plus 5


def test_collectives_without_a_group_are_refused():
    """Collectives refuse to act locally when there are two processes and no process group."""
    accelerator = Accelerator("cpu", dist=DistInfo(rank=0, world_size=2))
    for collective in (lambda: accelerator.gather(torch.ones(1)), lambda: accelerator.reduce(torch.ones(1)),
                       lambda: accelerator.gather_for_metrics(torch.ones(1)), accelerator.wait_for_everyone,
                       accelerator.check_trigger):
        with pytest.raises(LaunchError) as error:
            collective()
        assert "counts 2 processes, but this process has joined no process group" in str(error.value)


# -- helpers around the step ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rank, expected, padded", [
    (0, ["a", "b", "c"], ["a", "b", "c"]), (1, ["d", "e"], ["d", "e", "e"]), (2, ["f", "g"], ["f", "g", "g"]),
])
def test_split_between_processes_splits_each_type(rank, expected, padded):
    """split_between_processes splits lists, dicts and tensors."""
    accelerator = Accelerator("cpu", dist=DistInfo(rank=rank, world_size=3))
    letters = list("abcdefg")
    with accelerator.split_between_processes(letters) as part:
        assert part == expected
    with accelerator.split_between_processes(letters, apply_padding=True) as part:
        assert part == padded
    with accelerator.split_between_processes({"x": letters, "y": torch.arange(7)}) as part:
        assert part["x"] == expected and part["y"].tolist() == [letters.index(c) for c in expected]
    with accelerator.split_between_processes(torch.arange(7), apply_padding=True) as part:
        assert part.tolist() == [letters.index(c) for c in expected] + [6] * (3 - len(expected))


def test_split_between_processes_takes_dataset_rows():
    from datasets import Dataset

    rows = Dataset.from_dict({"x": list(range(5))})
    parts = []
    for rank in range(2):
        with Accelerator("cpu", dist=DistInfo(rank=rank, world_size=2)).split_between_processes(
                rows, apply_padding=True) as part:
            parts.append(part["x"])
    assert parts == [[0, 1, 2], [3, 4, 4]]


def test_split_between_processes_refuses_uneven_dict():
    with pytest.raises(ConfigError) as error:
        with Accelerator("cpu").split_between_processes({"x": [1, 2], "y": [1]}):
            pass
    assert "split_between_processes(inputs)" in str(error.value) and "[1, 2]" in str(error.value)


def test_process_decorators_run_only_where_they_say():
    calls = []
    for rank, local in ((0, 0), (1, 0), (2, 1)):
        accelerator = Accelerator("cpu", dist=DistInfo(rank=rank, local_rank=local, world_size=3, local_world_size=2))
        accelerator.on_main_process(lambda: calls.append(("main", rank)))()
        accelerator.on_local_main_process(lambda: calls.append(("local", rank)))()
        accelerator.on_process(process_index=2)(lambda: calls.append(("two", rank)))()
        accelerator.on_last_process(lambda: calls.append(("last", rank)))()
    assert calls == [("main", 0), ("local", 0), ("local", 1), ("two", 2), ("last", 2)]


def test_prepare_one_kind_at_a_time_and_main_only_save(tmp_path):
    accelerator = Accelerator("cpu", gradient_accumulation_steps=2)
    model = accelerator.prepare_model(nn.Linear(1, 1))
    optimizer = accelerator.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    scheduler = accelerator.prepare_scheduler(torch.optim.lr_scheduler.StepLR(optimizer, 1))
    loader = accelerator.prepare_data_loader(make_loader(4, 2))
    assert isinstance(scheduler, AcceleratedScheduler) and [b[0].tolist() for b in loader] == [[0, 1], [2, 3]]
    accelerator.save({"w": 1}, tmp_path / "main.pt")
    Accelerator("cpu", dist=DistInfo(rank=1, world_size=2)).save({"w": 2}, tmp_path / "other.pt")
    assert torch.load(tmp_path / "main.pt") == {"w": 1} and not (tmp_path / "other.pt").exists()
    assert accelerator.is_last_process
    with pytest.raises(TypeError) as error:
        accelerator.prepare_model(optimizer)
    assert "prepare_model() takes a torch.nn.Module, not a AcceleratedOptimizer" in str(error.value)


def test_trigger_register_and_free_memory_work():
    """The trigger fires once; register_for_checkpointing refuses stateless objects; free_memory drops the models."""
    accelerator = Accelerator("cpu")
    assert not accelerator.check_trigger()
    accelerator.set_trigger()
    assert accelerator.check_trigger() and not accelerator.check_trigger()
    model = accelerator.prepare(nn.Linear(1, 1))
    accelerator.register_for_checkpointing(torch.optim.lr_scheduler.StepLR(
        torch.optim.SGD(model.parameters(), lr=1.0), 1))
    with pytest.raises(ValueError) as error:  # Accelerate's type, and its "Item at index" for each one refused
        accelerator.register_for_checkpointing(model, object(), torch.zeros(1))
    assert "Item at index 1 (object), Item at index 2 (Tensor) have no state_dict()" in str(error.value)
    assert "Item at index 0" not in str(error.value)
    assert accelerator.free_memory(model) == [None]
    assert accelerator._models == [] and accelerator.custom_objects == []


def test_unwrap_model_through_torch_compile():
    """Accelerate keeps a compile wrapper by default and removes it with keep_torch_compile=False; so does the
    runner."""
    import accelerate

    model = nn.Linear(2, 2)
    compiled = torch.compile(model)
    for keep in (True, False):
        expected = accelerate.Accelerator(cpu=True).unwrap_model(compiled, keep_torch_compile=keep)
        assert Accelerator("cpu").unwrap_model(compiled, keep_torch_compile=keep) is expected
    assert Accelerator("cpu").unwrap_model(compiled, keep_torch_compile=False) is model


def test_trackers_write_tensorboard_that_reads_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accelerator = Accelerator("cpu", log_with="tensorboard", project_dir=tmp_path)
    accelerator.init_trackers("run1", config={"lr": 0.1, "name": "x"})
    for step in range(3):
        accelerator.log({"train/loss": 1.0 / (step + 1)}, step=step)
    assert accelerator.get_tracker("tensorboard", unwrap=True) is accelerator.trackers[0].writer
    accelerator.end_training()
    events = EventAccumulator(str(tmp_path / "run1"), size_guidance={"scalars": 0})
    events.Reload()
    loss = events.Scalars("train/loss")
    assert [(e.step, round(e.value, 4)) for e in loss] == [(0, 1.0), (1, 0.5), (2, 0.3333)]
    assert "hparams" in events.PluginTagToContent("hparams") or events.PluginTagToContent("hparams")


# -- 2 gloo processes: one launch, a test per check ------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_processes():
    import torch._dynamo  # noqa: F401 - the first optimizer imports it (seconds); forked processes inherit it
    from dist_workers import launch
    from parity_workers import all_checks

    results = launch(all_checks)
    return [results[0], results[1]]


def check(two_processes, name: str) -> list:
    for rank, result in enumerate(two_processes):
        assert "error" not in result[name], f"rank {rank}: {result[name].get('error')}"
    return [result[name] for result in two_processes]


@pytest.mark.parametrize("case", ["generator", "global_rng", "split", "custom_sampler"])
def test_two_processes_at_b_match_one_process_at_2b(two_processes, case):
    """The loader's own generator; split_batches at the one-process batch; a sampler of the user's own whose
    generator is seeded differently on each process (rank 0's state is given to all, as Accelerate does): the same
    global order every step of 2 epochs, and the same parameters, as one process at twice the batch. The global
    RNG with each process seeded differently: the same order and parameters as Accelerate's own Accelerator on
    the same 2 processes (a generator seeded at prepare, rank 0's state leading each pass), and the global RNG
    left where Accelerate leaves it."""
    if case == "global_rng":
        for result in check(two_processes, "reproduce"):
            assert result["global_rng_after"]["runner"] == result["global_rng_after"]["accelerate"]
    for result in check(two_processes, "reproduce"):
        (plain_order, plain_params), (order, params) = result[case]["plain"], result[case]["two"]
        assert len(order) == 10 and order == plain_order
        assert sorted(order[0] + order[1] + order[2] + order[3] + order[4]) == list(range(40))
        assert params == pytest.approx(plain_params, abs=1e-12)


def test_two_processes_deal_every_loader_kind(two_processes):
    """Two processes deal iterable, custom and key loaders."""
    zero, one = check(two_processes, "loaders")
    assert zero["stream"] == [[0, 1], [4, 5], [8, 9]] and one["stream"] == [[2, 3], [6, 7], [10, 0]]
    assert zero["custom"] == [[0], [3, 4, 5]] and one["custom"] == [[1, 2], [6, 7, 8, 9]]
    assert zero["uneven"] == [[0, 1], [4, 5], [8, 9]] and one["uneven"] == [[2, 3], [6, 7]]


def test_two_processes_agree_on_the_seedable_order(two_processes):
    """Two processes agree on the seedable sampler's order without asking each other."""
    for result in check(two_processes, "loaders"):
        # Epoch e shuffles with data_seed + e on every process: together they draw that permutation, in order.
        assert result["seeded"] == [torch.randperm(8, generator=torch.Generator().manual_seed(seed)).tolist()
                                    for seed in (3, 4)]


def test_dispatch_batches_reads_on_the_main_process_as_accelerate(two_processes):
    """dispatch_batches=True: the main process reads each step and sends it; every process keeps the slice, the
    gathered batches, end_of_dataloader, len() and skip_first_batches of Accelerate's DataLoaderDispatcher, whole
    or split batches, with and without drop_last, in order or shuffled (seeded, or by the main process's RNG)."""
    results = check(two_processes, "dispatched")
    for rank, result in enumerate(results):
        for case, seen in result.items():
            assert seen["runner"] == seen["accelerate"], (rank, case)
    # 11 rows in batches of 2, two a step: the last step (rows 8-10) completed with the pass's first row.
    assert [result["whole"]["runner"]["slices"][:3] for result in results] == [[[[0, 1]], [[4, 5]], [[8, 9]]],
                                                                               [[[2, 3]], [[6, 7]], [[10, 0]]]]
    assert results[0]["whole"]["runner"]["gathered"][2] == [list(range(8, 11))]  # the repeat dropped
    assert results[0]["whole"]["runner"]["ends"] == [False, False, True] * 2 and results[0]["whole"]["runner"][
        "len"] == 3
    assert results[1]["split_drop_last"]["runner"]["slices"] == [[[2, 3]], [[6, 7]]] * 2  # rows 8-10 dropped


def test_gather_for_metrics_drops_the_repeats(two_processes):
    """gather_for_metrics drops the repeats of streams, keys and objects."""
    for result in check(two_processes, "loaders"):
        assert result["stream_metrics"] == list(range(11))
        assert result["by_key_metrics"] == [k for k in range(5) for _ in range(2)]  # each key: a batch of 2
        assert result["word_metrics"] == ["s0", "s1", "s2", "s3", "s4"]


def test_two_processes_sync_at_the_loader_end(two_processes):
    """Two processes sync at the end of the loader and step the schedule twice per optimizer step."""
    for result in check(two_processes, "accumulation"):
        assert result["syncs"] == [False, True, True]
        assert result["scheduler_steps"] == 4  # 2 optimizer steps x 2 processes
        # Two forwards of x, loss divided by the 2 micro-steps: x per process, averaged: (1 + 2) / 2.
        assert result["each_batch_grads"] == [[1.5, 1.5], [1.5, 1.5]] and result["each_batch_held"]


def test_two_process_collectives(two_processes):
    zero, one = check(two_processes, "collectives")
    for result in (zero, one):
        assert result["non_contiguous"] == [[0, 3], [1, 4], [2, 5], [10, 13], [11, 14], [12, 15]]
        assert result["nested"] == {"a0": [0, 1], "a1": [[0, 0], [1, 1]]}
        assert result["sum"] == [2.0, 1.0] and result["mean"] == [1.0]
        assert result["padded"] == [1, 1, -1, 1, 1, 1]
        assert result["triggered"] == [True, False]
        assert result["split"] == [0, 1, 2, 3, 4, 4]
        assert result["distributed_type"] == "MULTI_CPU"
    assert zero["pad_first"] == [[0.0, 1.0]] and one["pad_first"] == [[1.0, 1.0]]
    assert zero["main_only"] == 0 and one["main_only"] is None


def test_join_uneven_inputs_lets_one_finish_first(two_processes):
    """join_uneven_inputs lets the process with fewer batches finish first."""
    zero, one = check(two_processes, "joined")
    assert (zero["steps"], one["steps"]) == (3, 2) and zero["equal"] and one["equal"]
    assert zero["even_after"] and one["even_after"]  # the loader's own setting is back after the block
    assert (zero["batches_after"], one["batches_after"]) == (3, 3)


def test_two_process_no_sync_trigger_unwrap_pickle_and_skip(two_processes):
    zero, one = check(two_processes, "models")
    for result in (zero, one):
        assert result["local"] == [[1.0, 1.0], [2.0, 2.0]] and result["synced"] == [[1.5, 1.5], [1.5, 1.5]]
        assert result["triggered"] == [[3.0, 3.0], [3.0, 3.0]] and result["sync_restored"] is True  # (2 + 4) / 2
        assert result["unwrapped"]
        assert result["copied"] == result["original"] and sorted(sum(result["copied"], [])) == list(range(12))
    assert zero["skipped"] == [[4, 5], [8, 9]] and one["skipped"] == [[6, 7], [10, 11]]


class Counter:
    """An object of the user's own registered for checkpointing (state_dict/load_state_dict)."""

    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def test_save_state_names_prunes_and_keeps_objects(tmp_path):
    """save_state names its directories, keeps total_limit of them, and saves the registered objects."""
    from runner import ProjectConfiguration

    with pytest.raises(ConfigError, match=r"save_state\(output_dir\): no directory given; pass one, or create the "
                                          r"Accelerator with project_config=ProjectConfiguration"):
        Accelerator(cpu=True).save_state()
    project = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(cpu=True, project_config=project)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    for value in (1, 2, 3):
        counter.value = value
        with torch.no_grad():
            model.weight.fill_(value)
        accelerator.save_state()
    kept = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert kept == ["checkpoint_1", "checkpoint_2"] and project.iteration == 3  # the oldest went after the third

    again = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path),
                                                                      automatic_checkpoint_naming=True))
    fresh, restored = again.prepare(torch.nn.Linear(2, 1)), Counter()
    again.register_for_checkpointing(restored)
    again.load_state()  # the newest
    assert restored.value == 3 and fresh.weight.eq(3).all()
    assert again.project_configuration.iteration == 3  # the next save is checkpoint_3
    # A third Accelerator starting its numbering at 0 would replace (or, with total_limit, prune) those states.
    third = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path),
                                                                      automatic_checkpoint_naming=True, total_limit=2))
    third.prepare(torch.nn.Linear(2, 1))
    with pytest.raises(CheckpointError, match=r"already holds checkpoint_2, so checkpoint_0 would replace or predate"):
        third.save_state()
    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_1", "checkpoint_2"]

    class Unsafe(Counter):
        def state_dict(self):
            return {"value": __import__("numpy").arange(3)}

    again.register_for_checkpointing(Unsafe())
    with pytest.raises(CheckpointError, match=r"state_dict\(\) of registered Unsafe holds something load_state "
                                              r"cannot read back safely"):
        again.save_state(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="ProjectConfiguration.total_limit: is 0"):
        Accelerator(cpu=True, project_config=ProjectConfiguration(str(tmp_path), None, True, 0)).save_state()


# -- what Accelerate's own scripts pass (issue 26): the same values, keywords and objects -----------------------------

def fresh_accelerate(**kwargs):
    """accelerate.Accelerator(**kwargs) in this process, its global state reset first (Accelerate refuses another
    mixed_precision once its AcceleratorState singleton exists)."""
    import accelerate
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return accelerate.Accelerator(**kwargs)


def test_prepare_autocasts_the_forward_as_accelerate_does():
    """Under bf16 a prepared model runs its forward in bf16 and returns fp32, without accelerator.autocast(), equal
    to Accelerate's prepared model; unwrap_model(keep_fp32_wrapper=False) gives back the plain fp32 forward."""
    inputs = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    outputs = {}
    for name, make in (("runner", lambda: Accelerator(cpu=True, mixed_precision="bf16")),
                       ("accelerate", lambda: fresh_accelerate(cpu=True, mixed_precision="bf16"))):
        torch.manual_seed(0)
        accelerator = make()
        model = accelerator.prepare(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
        prepared = model(inputs)
        plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)(inputs)
        outputs[name] = (prepared, plain)
    (prepared, plain), (expected, expected_plain) = outputs["runner"], outputs["accelerate"]
    assert prepared.dtype == expected.dtype == torch.float32
    assert torch.equal(prepared, expected) and torch.equal(plain, expected_plain)
    assert not torch.equal(prepared, plain)  # bf16 arithmetic, not fp32's
    # The runner's own loop autocasts explicitly: its model's forward is left as it is, fp32 outside autocast().
    torch.manual_seed(0)
    reference = nn.Linear(8, 4)
    model = Accelerator(cpu=True, mixed_precision="bf16", autocast_forward=False).prepare(_copy_of(reference))
    assert "_original_forward" not in model.__dict__ and torch.equal(model(inputs), reference(inputs))


def test_a_copy_of_a_prepared_model_runs_its_own_forward():
    """The autocast forward is bound to its model: a deepcopy (an EMA copy) computes with the copy's weights."""
    model = Accelerator(cpu=True, mixed_precision="bf16").prepare(nn.Linear(4, 4))
    copied = _copy_of(model)
    with torch.no_grad():
        copied.weight.zero_()
        copied.bias.zero_()
    inputs = torch.randn(2, 4)
    assert torch.equal(copied(inputs), torch.zeros(2, 4)) and not torch.equal(model(inputs), torch.zeros(2, 4))


def _copy_of(module: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(module)


def test_properties_and_enum_match_accelerate():
    import accelerate

    for mixed_precision in ("no", "bf16", "fp16"):
        ours, theirs = (Accelerator(cpu=True, mixed_precision=mixed_precision),
                        fresh_accelerate(cpu=True, mixed_precision=mixed_precision))
        for name in ("mixed_precision", "distributed_type", "num_processes", "process_index", "local_process_index",
                     "is_main_process", "is_local_main_process", "gradient_accumulation_steps", "sync_gradients",
                     "use_distributed", "split_batches", "even_batches", "device"):
            assert getattr(ours, name) == getattr(theirs, name), (mixed_precision, name)
    members = {member.name: member.value for member in accelerate.DistributedType}
    assert members == {member.name: member.value for member in DistributedType if member.name in members}
    assert Accelerator(cpu=True, split_batches=True).split_batches is True
    with pytest.raises(ConfigError, match=r"Accelerator\(split_batches\): is False and dataloader_config"):
        Accelerator(cpu=True, split_batches=False, dataloader_config=DataLoaderConfiguration(split_batches=True))


def test_accelerates_own_config_objects_are_honoured_or_refused(tmp_path):
    """accelerate's DataLoaderConfiguration, ProjectConfiguration, GradientAccumulationPlugin and kwargs handlers
    are read as the runner's; what the runner does not support is refused, naming it, never ignored."""
    import accelerate
    from accelerate.utils import DistributedDataParallelKwargs, GradScalerKwargs as TheirScalerKwargs
    from accelerate.utils import ProjectConfiguration as TheirProject

    accelerator = Accelerator(
        "cpu", "fp16", dataloader_config=accelerate.DataLoaderConfiguration(split_batches=True, even_batches=False),
        gradient_accumulation_plugin=accelerate.utils.GradientAccumulationPlugin(num_steps=3),
        project_config=TheirProject(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2),
        kwargs_handlers=[TheirScalerKwargs(init_scale=1024), DistributedDataParallelKwargs(bucket_cap_mb=5)])
    assert accelerator.split_batches is True and accelerator.even_batches is False
    assert accelerator.gradient_accumulation_steps == 3 and accelerator.scaler.get_scale() == 1024.0
    assert accelerator.project_configuration.total_limit == 2 and accelerator.parallel.bucket_cap_mb == 5
    dispatching = Accelerator("cpu", dataloader_config=accelerate.DataLoaderConfiguration(dispatch_batches=True))
    assert dispatching.dataloader_config.dispatch_batches is True  # honoured: on one process, the plain batches
    assert [batch.tolist() for batch in dispatching.prepare(DataLoader(range(5), batch_size=2))] == [[0, 1], [2, 3],
                                                                                                      [4]]
    with pytest.raises(ConfigError, match=r"use_stateful_dataloader.*skip_first_batches"):
        Accelerator("cpu", dataloader_config=accelerate.DataLoaderConfiguration(use_stateful_dataloader=True))
    with pytest.raises(ConfigError, match=r"Accelerator\(project_config\): accelerate.utils.dataclasses."
                                          r"ProjectConfiguration sets save_on_each_node=True"):
        Accelerator("cpu", project_config=TheirProject(save_on_each_node=True))


def test_custom_trackers_are_called_as_accelerate_calls_them(tmp_path):
    """A GeneralTracker of the user's own in log_with: the config at init_trackers, every log with its step, finish
    at end_training, get_tracker by name; the same calls, in the same order, as under Accelerate."""
    from accelerate.tracking import GeneralTracker

    class Recorder(GeneralTracker):
        name, requires_logging_directory = "recorder", False

        def __init__(self):
            super().__init__()
            self.calls = []

        @property
        def tracker(self):
            return self.calls

        def store_init_configuration(self, values):
            self.calls.append(("config", dict(values)))

        def log(self, values, step=None, **kwargs):
            self.calls.append(("log", dict(values), step))

        def finish(self):
            self.calls.append(("finish",))

    recorded = {}
    for name, make in (("runner", Accelerator), ("accelerate", fresh_accelerate)):
        recorder = Recorder()
        accelerator = make(cpu=True, log_with=[recorder], project_dir=tmp_path / name)
        accelerator.init_trackers("run", config={"lr": 0.1})
        accelerator.log({"loss": 0.5}, step=3)
        assert accelerator.get_tracker("recorder") is recorder
        accelerator.end_training()
        recorded[name] = recorder.calls
    assert recorded["runner"] == recorded["accelerate"] == [("config", {"lr": 0.1}), ("log", {"loss": 0.5}, 3),
                                                            ("finish",)]


def test_save_and_load_state_hooks_and_keywords(tmp_path, caplog):
    """register_save_state_pre_hook/register_load_state_pre_hook as in Accelerate (a model the hook takes out is
    saved and loaded by the hook), save_state(safe_serialization=False) still writes safetensors (said once),
    reader arguments are refused, Accelerate's map_location values accepted."""
    caplog.set_level("INFO")
    accelerator = Accelerator(cpu=True)
    first, second = accelerator.prepare(nn.Linear(2, 2), nn.Linear(3, 3))
    seen = []

    def keep_second_out(models, weights, output_dir):
        seen.append((len(models), len(weights), output_dir))
        weights.pop(1)  # the hook saves the second model its own way

    handle = accelerator.register_save_state_pre_hook(keep_second_out)
    saved = accelerator.save_state(tmp_path / "state", safe_serialization=False)
    assert seen == [(2, 2, str(tmp_path / "state"))] and "written as safetensors anyway" in caplog.text
    assert sorted(path.name for path in saved.glob("*.safetensors")) == ["model_0.safetensors"]
    handle.remove()
    accelerator.save_state(tmp_path / "again")
    assert len(seen) == 1  # removed
    before = first.weight.detach().clone()
    with torch.no_grad():
        first.weight.zero_()
    loaded = []
    accelerator.register_load_state_pre_hook(lambda models, input_dir: (loaded.append(input_dir), models.pop(1)))
    accelerator.load_state(tmp_path / "state")
    assert loaded == [str(tmp_path / "state")] and torch.equal(first.weight, before)
    with pytest.raises(TypeError, match=r"load_state\(\) got \['map_location'\]"):
        accelerator.load_state(tmp_path / "state", load_kwargs={"map_location": "cpu"})
    for map_location in ("cpu", "on_device"):  # Accelerate's two: the state lands with its parameters either way
        accelerator.load_state(tmp_path / "state", map_location=map_location)
    with pytest.raises(TypeError, match="Unsupported optimizer map location passed.*Got `cuda:3`"):
        accelerator.load_state(tmp_path / "state", map_location="cuda:3")


@pytest.mark.parametrize("safe_serialization", [True, False], ids=["safetensors", "bin"])
def test_load_state_reads_a_directory_accelerate_wrote(tmp_path, safe_serialization):
    """Switching mid-project: Accelerate's save_state (two models, optimizer, scheduler, a registered object, RNG)
    loaded by runner.Accelerator's load_state: every state equal, the random generators where Accelerate left
    them; its pickles read as plain data only."""
    import random

    import numpy as np

    def objects(seed: int):
        torch.manual_seed(seed)
        models = [nn.Linear(3, 2), nn.Linear(2, 1)]
        optimizer = torch.optim.AdamW([p for model in models for p in model.parameters()], lr=0.1)
        return models, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 2)

    theirs = fresh_accelerate(cpu=True)
    models, optimizer, scheduler = objects(0)
    first, second, optimizer, scheduler = theirs.prepare(*models, optimizer, scheduler)
    counter = Counter()
    counter.value = 7
    theirs.register_for_checkpointing(counter)
    for _ in range(3):
        second(first(torch.randn(4, 3))).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    theirs.save_state(str(tmp_path / "accelerate"), safe_serialization=safe_serialization)
    expected_rng = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    torch.rand(5), random.random(), np.random.rand()  # move every generator on

    ours = Accelerator(cpu=True)
    models, fresh_optimizer, fresh_scheduler = objects(1)
    loaded_first, loaded_second, fresh_optimizer, fresh_scheduler = ours.prepare(*models, fresh_optimizer,
                                                                                  fresh_scheduler)
    restored = Counter()
    ours.register_for_checkpointing(restored)
    ours.load_state(tmp_path / "accelerate")
    for mine, saved in ((loaded_first, first), (loaded_second, second)):
        assert all(torch.equal(a, b) for a, b in zip(mine.state_dict().values(), saved.state_dict().values()))
    saved_state, loaded_state = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
    assert all(torch.equal(saved_state[key]["exp_avg"], loaded_state[key]["exp_avg"]) for key in saved_state)
    assert fresh_scheduler.state_dict()["last_epoch"] == 3 and restored.value == 7
    assert torch.equal(torch.get_rng_state(), expected_rng[0]) and random.getstate() == expected_rng[1]
    assert np.array_equal(np.random.get_state()[1], expected_rng[2])


def test_load_state_refuses_an_accelerate_pickle_holding_code(tmp_path):
    """A random_states_0.pkl that would run a command when unpickled: refused, naming the file; nothing runs."""
    from checkpoint_helpers import TouchesAFile

    theirs = fresh_accelerate(cpu=True)
    theirs.prepare(nn.Linear(2, 2))
    theirs.save_state(str(tmp_path / "accelerate"))
    marker = tmp_path / "ran"
    torch.save({"random_state": TouchesAFile(marker)}, tmp_path / "accelerate" / "random_states_0.pkl")
    ours = Accelerator(cpu=True)
    ours.prepare(nn.Linear(2, 2))
    with pytest.raises(CheckpointError, match=r"random_states_0.pkl holds objects other than tensors, numbers, "
                                              r"strings and containers .* could run code"):
        ours.load_state(tmp_path / "accelerate")
    assert not marker.exists()
    ours_two = Accelerator(cpu=True)
    ours_two.prepare(nn.Linear(2, 2), nn.Linear(2, 2))
    with pytest.raises(CheckpointError, match=r"holds 1 model\(s\) \(model.safetensors\), but 2 were prepared"):
        ours_two.load_state(tmp_path / "accelerate")
