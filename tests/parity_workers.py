"""What 2 gloo processes run for tests/accelerate/test_accelerate_parity.py: every check in one launch (starting
processes costs seconds), each returning plain values (or the error it raised) under its own name.

The 1-process references are computed inside each process without collectives: plain DataLoaders and models.
"""

from __future__ import annotations

import pickle
import traceback

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, TensorDataset

from runner import Accelerator, DataLoaderConfiguration, GradientAccumulationPlugin
from runner.distributed.dist import DistInfo, destroy_process_group, init_process_group


def all_checks() -> dict:
    torch.set_num_threads(1)
    init_process_group(DistInfo.from_env(), "gloo", timeout_s=120)  # a check that hangs fails in 2 minutes
    results = {}
    try:
        for name, check in CHECKS.items():
            try:
                results[name] = check()
            except Exception:  # noqa: BLE001 - reported to the test that asserts this check
                results[name] = {"error": traceback.format_exc()}
        return results
    finally:
        destroy_process_group()


def _data(rows: int = 40) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(rows, 3, generator=generator, dtype=torch.float64)
    return TensorDataset(torch.arange(rows), inputs, inputs @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))


def _model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Linear(3, 1).double()


def _train(accelerator, loader, model, epochs: int = 2) -> tuple[list[list[int]], list[float]]:
    """Train with SGD; every step's sample ids (gathered across processes) and the final parameters."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if accelerator is not None:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    order = []
    for _ in range(epochs):
        for ids, inputs, targets in loader:
            loss = nn.functional.mse_loss(model(inputs).squeeze(1), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            order.append((accelerator.gather(ids) if accelerator is not None else ids).tolist())
    module = accelerator.unwrap_model(model) if accelerator is not None else model
    return order, [value for p in module.parameters() for value in p.detach().flatten().tolist()]


def reproduces_one_process_at_twice_the_batch() -> dict:
    """2 processes at batch 4 against 1 at batch 8: the loader's own generator, then the global RNG (each process
    seeded differently: they must still agree on rank 0's shuffle), then split_batches at batch 8."""
    rank = DistInfo.from_env().rank
    out = {}
    plain = _train(None, DataLoader(_data(), batch_size=8, shuffle=True,
                                    generator=torch.Generator().manual_seed(7)), _model())
    two = _train(Accelerator("cpu"), DataLoader(_data(), batch_size=4, shuffle=True,
                                                generator=torch.Generator().manual_seed(7)), _model())
    out["generator"] = {"plain": plain, "two": two}
    # The global RNG, each process seeded differently: the order and the weights are Accelerate's own on the same
    # 2 processes (its prepare seeds one generator from the global RNG, then rank 0's state leads every pass).
    model = _model()  # made before seeding: the shuffle must come from the seed set next
    torch.manual_seed(3 + 100 * rank)
    accelerate_order = _train(_accelerate(), DataLoader(_data(), batch_size=4, shuffle=True), model)
    accelerate_after = torch.rand(3).tolist()  # where the global RNG was left
    model = _model()
    torch.manual_seed(3 + 100 * rank)
    two = _train(Accelerator("cpu"), DataLoader(_data(), batch_size=4, shuffle=True), model)
    out["global_rng"] = {"plain": accelerate_order, "two": two}
    out["global_rng_after"] = {"accelerate": accelerate_after, "runner": torch.rand(3).tolist()}
    split = Accelerator("cpu", dataloader_config=DataLoaderConfiguration(split_batches=True))
    two = _train(split, DataLoader(_data(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(7)),
                 _model())
    out["split"] = {"plain": out["generator"]["plain"], "two": two}
    plain = _train(None, DataLoader(_data(), batch_size=8, sampler=Reversed(40, seed=5)), _model())
    two = _train(Accelerator("cpu"), DataLoader(_data(), batch_size=4, sampler=Reversed(40, seed=5 + rank)), _model())
    out["custom_sampler"] = {"plain": plain, "two": two}
    return out


def _accelerate(**kwargs):
    """HuggingFace Accelerate's own Accelerator in this process group (the test extra installs it)."""
    import accelerate
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return accelerate.Accelerator(cpu=True, **kwargs)


class Reversed(torch.utils.data.Sampler):
    """A sampler of the user's own with a generator: a random permutation, reversed."""

    def __init__(self, n: int, seed: int):
        self.n, self.generator = n, torch.Generator().manual_seed(seed)

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self.generator).flip(0).tolist())

    def __len__(self):
        return self.n


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(11))


class ByLength(BatchSampler):
    """A batch sampler of its own: batches of 1, 2, 3, ... indices."""

    def __init__(self):
        pass

    def __iter__(self):
        start, size = 0, 1
        while start < 10:
            yield list(range(start, min(10, start + size)))
            start, size = start + size, size + 1

    def __len__(self):
        return 4


def loaders_of_every_kind() -> dict:
    """What each process draws from an IterableDataset, a custom batch sampler, a batch_size=None loader, uneven
    batches, and what gather_for_metrics makes of them."""
    accelerator = Accelerator("cpu")
    stream = accelerator.prepare(DataLoader(Stream(), batch_size=2))
    drawn, metrics = [], []
    for batch in stream:
        drawn.append(batch.tolist())
        metrics += accelerator.gather_for_metrics(batch).tolist()
    custom = accelerator.prepare(DataLoader(TensorDataset(torch.arange(10)), batch_sampler=ByLength()))
    by_key = accelerator.prepare(DataLoader([torch.full((2,), k) for k in range(5)], batch_size=None))
    key_metrics = []
    for batch in by_key:
        key_metrics += accelerator.gather_for_metrics(batch).tolist()
    uneven = Accelerator("cpu", dataloader_config=DataLoaderConfiguration(even_batches=False))
    names = [f"s{i}" for i in range(5)]
    words = accelerator.prepare(DataLoader(names, batch_size=2))
    word_metrics = []
    for batch in words:
        word_metrics += accelerator.gather_for_metrics(batch)
    torch.manual_seed(accelerator.process_index)  # the seedable sampler must not depend on the global RNG
    seeded = Accelerator("cpu", dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=3))
    shuffled = seeded.prepare(DataLoader(TensorDataset(torch.arange(8)), batch_size=2, shuffle=True))
    seeded_order = [sum((seeded.gather(batch[0]).tolist() for batch in shuffled), []) for _ in range(2)]
    return {
        "seeded": seeded_order,
        "stream": drawn, "stream_metrics": metrics,
        "custom": [batch[0].tolist() for batch in custom],
        "by_key_metrics": key_metrics,
        "uneven": [batch[0].tolist() for batch in uneven.prepare(DataLoader(TensorDataset(torch.arange(10)),
                                                                            batch_size=2))],
        "word_metrics": word_metrics,
    }


def accumulation_and_schedule() -> dict:
    """accumulate() over a loader whose end falls inside a cycle; a StepLR stepped by Accelerate's convention."""
    accelerator = Accelerator("cpu", gradient_accumulation_steps=2)
    model = accelerator.prepare(nn.Linear(1, 1))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    scheduler = accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1))
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(12.0)), batch_size=2))  # 3 batches each
    syncs = []
    for (inputs,) in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(inputs.unsqueeze(1)).sum())
            syncs.append(accelerator.sync_gradients)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    return {"syncs": syncs, "scheduler_steps": scheduler.last_epoch, **_sync_each_batch()}


def _sync_each_batch() -> dict:
    """sync_each_batch: the first micro-batch's gradients (two forwards of it) are already averaged over the
    processes, but the optimizer still waits for the cycle's end."""
    plugin = GradientAccumulationPlugin(num_steps=2, sync_each_batch=True)
    accelerator = Accelerator("cpu", gradient_accumulation_plugin=plugin)
    rank = accelerator.process_index
    model = accelerator.prepare(nn.Linear(2, 1, bias=False))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=1.0))
    before = model.module.weight.detach().clone()
    with accelerator.accumulate(model):
        inputs = torch.full((1, 2), float(rank + 1))
        accelerator.backward(model(inputs).sum() + model(inputs).sum())
        optimizer.step()
    return {"each_batch_grads": accelerator.gather(model.module.weight.grad.clone()).tolist(),
            "each_batch_held": torch.equal(before, model.module.weight.detach())}


def joined() -> dict:
    """join_uneven_inputs with even_batches=False: process 0 takes 3 steps, process 1 two, nobody waits forever,
    and the models end equal."""
    accelerator = Accelerator("cpu")
    model = accelerator.prepare(nn.Linear(1, 1))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(10.0)), batch_size=2))
    steps = 0
    with accelerator.join_uneven_inputs([model], even_batches=False):
        for (inputs,) in loader:
            model(inputs.unsqueeze(1)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
    weights = accelerator.gather(model.module.weight.detach().clone()).tolist()
    return {"steps": steps, "equal": weights[0] == weights[1], "even_after": loader.batch_shard.even_batches,
            "batches_after": len(loader)}


def collectives() -> dict:
    accelerator = Accelerator("cpu")
    rank = accelerator.process_index
    mine = torch.arange(6.0).reshape(2, 3) + 10 * rank
    padded = accelerator.pad_across_processes(torch.ones(rank + 2, dtype=torch.long), pad_index=-1)
    first = accelerator.pad_across_processes(torch.ones(1, rank + 1), dim=1, pad_first=True)
    nested = accelerator.gather({"a": [torch.tensor([rank]), (torch.tensor([[rank, rank]]),)]})
    if rank == 1:
        accelerator.set_trigger()
    triggered = [accelerator.check_trigger(), accelerator.check_trigger()]
    with accelerator.split_between_processes(list(range(5)), apply_padding=True) as part:
        shared = accelerator.gather(torch.tensor(part)).tolist()
    return {
        "non_contiguous": accelerator.gather(mine.t()).tolist(),
        "nested": {"a0": nested["a"][0].tolist(), "a1": nested["a"][1][0].tolist()},
        "sum": accelerator.reduce({"x": torch.tensor([1.0, rank])})["x"].tolist(),
        "mean": accelerator.reduce(torch.tensor([2.0 * rank]), "mean").tolist(),
        "padded": accelerator.gather(padded).tolist(),
        "pad_first": first.tolist(),
        "triggered": triggered,
        "split": shared,
        "main_only": accelerator.on_main_process(lambda: rank)(),
        "distributed_type": accelerator.distributed_type.value,
    }


def models_and_loaders() -> dict:
    """no_sync keeps gradients local, trigger_sync_in_backward all-reduces them inside it; unwrap_model goes through
    DDP and torch.compile; a prepared loader pickles and skips batches on each process."""
    accelerator = Accelerator("cpu")
    rank = accelerator.process_index
    inner = nn.Linear(2, 1)
    model = accelerator.prepare(inner)
    with accelerator.no_sync(model):
        model(torch.full((1, 2), float(rank + 1))).sum().backward()
    local = accelerator.gather(model.module.weight.grad.clone()).tolist()
    model.zero_grad()
    model(torch.full((1, 2), float(rank + 1))).sum().backward()
    synced = accelerator.gather(model.module.weight.grad.clone()).tolist()
    model.zero_grad()
    # Accelerate's test_sync pattern: forwards under no_sync, the last one under trigger_sync_in_backward, then
    # one backward, which all-reduces (without the trigger it would not: every forward was under no_sync).
    with accelerator.no_sync(model):
        first = model(torch.full((1, 2), float(rank + 1))).sum()
        with accelerator.trigger_sync_in_backward(model):
            second = model(torch.full((1, 2), float(rank + 1))).sum()
    (first + second).backward()
    triggered = accelerator.gather(model.module.weight.grad.clone()).tolist()
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(12)), batch_size=2, shuffle=True,
                                            generator=torch.Generator().manual_seed(4)))
    copied = pickle.loads(pickle.dumps(loader))
    skipped = accelerator.skip_first_batches(accelerator.prepare(DataLoader(TensorDataset(torch.arange(12)),
                                                                            batch_size=2)), 1)
    return {
        "local": local, "synced": synced, "triggered": triggered, "sync_restored": model.require_backward_grad_sync,
        "unwrapped": accelerator.unwrap_model(torch.compile(model)) is inner,
        "copied": [accelerator.gather(batch[0]).tolist() for batch in copied],
        "original": [accelerator.gather(batch[0]).tolist() for batch in loader],
        "skipped": [batch[0].tolist() for batch in skipped],
    }


# dispatch_batches=True cases: (rows, batch_size, split_batches, drop_last, order), order "in order", "seeded"
# (use_seedable_sampler, data_seed=5) or "shuffled" (the global RNG, seeded alike on both processes).
DISPATCH_CASES = {
    "whole": (11, 2, False, False, "in order"), "whole_drop_last": (11, 2, False, True, "in order"),
    "split": (11, 4, True, False, "in order"), "split_drop_last": (11, 4, True, True, "in order"),
    "seeded": (12, 3, False, False, "seeded"), "shuffled": (13, 2, False, False, "shuffled"),
    "stream": (11, 2, False, False, "in order"),
}


def dispatched() -> dict:
    """Each case read by Accelerate's DataLoaderDispatcher and by the runner's, on the same 2 processes: this
    process's slices over 2 epochs, what gather_for_metrics returns, where end_of_dataloader is set, len(), and the
    slices after skip_first_batches(loader, 1); batches of dicts, and a stream, too."""
    import accelerate

    out = {}
    for name, (rows, batch_size, split, drop_last, order) in DISPATCH_CASES.items():
        for library in ("accelerate", "runner"):
            torch.manual_seed(7)
            options = dict(dispatch_batches=True, split_batches=split, use_seedable_sampler=order == "seeded",
                           data_seed=5 if order == "seeded" else None)
            if library == "accelerate":
                accelerator = _accelerate(dataloader_config=accelerate.DataLoaderConfiguration(**options))
            else:
                accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**options))
            dataset = {"seeded": [{"index": index, "tenfold": 10 * index} for index in range(rows)],
                       "stream": Stream()}.get(name, TensorDataset(torch.arange(rows)))  # (a stream of 11)
            loader = accelerator.prepare(DataLoader(dataset, batch_size=batch_size, drop_last=drop_last,
                                                    shuffle=order != "in order"))
            seen = {"len": len(loader) if name != "stream" else None, "slices": [], "gathered": [], "ends": []}
            for _ in range(2):
                for batch in loader:
                    seen["slices"].append(_plain(batch))
                    seen["ends"].append(loader.end_of_dataloader)
                    seen["gathered"].append(_plain(accelerator.gather_for_metrics(batch)))
            seen["skipped"] = [_plain(batch) for batch in accelerator.skip_first_batches(loader, 1)]
            out.setdefault(name, {})[library] = seen
    return out


def _plain(batch):
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, dict):
        return {key: _plain(value) for key, value in batch.items()}
    return [_plain(value) for value in batch]


CHECKS = {
    "reproduce": reproduces_one_process_at_twice_the_batch,
    "loaders": loaders_of_every_kind,
    "accumulation": accumulation_and_schedule,
    "collectives": collectives,
    "joined": joined,
    "models": models_and_loaders,
    "dispatched": dispatched,
}
