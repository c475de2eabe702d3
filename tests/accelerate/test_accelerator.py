"""runner.Accelerator against plain PyTorch: the same training, bitwise in fp32, within tolerances otherwise."""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runner.accelerate.accelerator import Accelerator, set_seed
from runner.checkpoint import damage
from runner.errors import CheckpointError, ConfigError, HardwareError
from runner.distributed.dist import DistInfo
from runner.accelerate.prepared import AcceleratedOptimizer, AcceleratedScheduler
from tolerances import reordered_sum_bound

STEPS = 6


def make_model(seed: int = 0, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 4))


def make_data(rows: int = 32 * STEPS, seed: int = 1) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(rows, 16, generator=generator), torch.randint(0, 4, (rows,), generator=generator))


def plain_loop(model, optimizer, loader, scheduler=None, max_norm=None) -> None:
    for features, labels in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(features), labels).backward()
        if max_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def accelerated_loop(accelerator, model, optimizer, loader, scheduler=None, max_norm=None) -> list:
    """The loop an Accelerate user writes: step every batch, let accumulate() decide when it counts."""
    norms = []
    for features, labels in loader:
        with accelerator.accumulate(model):
            with accelerator.autocast():
                loss = F.cross_entropy(model(features).float(), labels)
            accelerator.backward(loss)
            if max_norm is not None and accelerator.sync_gradients:
                norms.append(accelerator.clip_grad_norm_(model.parameters(), max_norm))
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad()
    return norms


def train_both(precision: str, optimizer_class=torch.optim.AdamW, **kwargs):
    reference, candidate = make_model(), make_model()
    plain_loop(reference, optimizer_class(reference.parameters(), lr=1e-2), DataLoader(make_data(), batch_size=32))
    accelerator = Accelerator("cpu", precision, **kwargs)
    model, optimizer, loader = accelerator.prepare(
        candidate, optimizer_class(candidate.parameters(), lr=1e-2), DataLoader(make_data(), batch_size=32)
    )
    accelerated_loop(accelerator, model, optimizer, loader)
    return reference, candidate


def max_difference(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def test_fp32_matches_a_plain_loop_bitwise():
    reference, candidate = train_both("fp32")
    for (name, expected), actual in zip(reference.named_parameters(), candidate.parameters()):
        assert torch.equal(expected, actual), name


def test_fp32_one_cpu_prepare_returns_its_inputs_and_tracks_the_loader():
    """fp32 on one CPU process: prepare() returns the very model and optimizer it was given; the loader is
    followed by gradient_state as Accelerate's is (its batches the plain loader's, in order)."""
    model, loader = make_model(), DataLoader(make_data(), batch_size=32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accelerator = Accelerator("cpu")
    prepared = accelerator.prepare(model, optimizer, loader)
    assert prepared[0] is model and prepared[1] is optimizer
    assert accelerator.gradient_state.active_dataloader is None
    batches = []
    for index, batch in enumerate(prepared[2]):
        assert accelerator.gradient_state.active_dataloader is prepared[2]
        assert accelerator.gradient_state.end_of_dataloader == (index == len(loader) - 1)
        batches.append(batch)
    assert accelerator.gradient_state.active_dataloader is None
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, loader)) and len(batches) == len(loader)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_stays_within_fp32_tolerance(precision):
    # SGD, so a rounding error moves a weight a little, not by a whole Adam step of lr.
    reference, candidate = train_both(precision, torch.optim.SGD)
    moved = max_difference(reference, make_model())
    # Stated tolerance: within 10% of how far training moved the weights (measured: bf16 1.5%, fp16 3.6%).
    assert 0 < max_difference(reference, candidate) < 0.1 * moved


def test_accumulating_4x8_matches_batches_of_32():
    reference, candidate = make_model(), make_model()
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    ref_scheduler = torch.optim.lr_scheduler.StepLR(ref_optimizer, step_size=1, gamma=0.5)
    plain_loop(reference, ref_optimizer, DataLoader(make_data(), batch_size=32), ref_scheduler)

    accelerator = Accelerator("cpu", gradient_accumulation_steps=4)
    raw_optimizer = torch.optim.SGD(candidate.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(raw_optimizer, step_size=1, gamma=0.5)
    # Any order: the scheduler and loader first, the model last.
    scheduler, loader, optimizer, model = accelerator.prepare(
        scheduler, DataLoader(make_data(), batch_size=8), raw_optimizer, candidate
    )
    assert isinstance(optimizer, AcceleratedOptimizer) and isinstance(scheduler, AcceleratedScheduler)
    accelerated_loop(accelerator, model, optimizer, loader, scheduler)

    # 4 micro-batches of 8 against one batch of 32: each step's gradient sums its 32 rows in another order.
    bound = reordered_sum_bound(32, max_difference(reference, make_model()))
    assert max_difference(reference, candidate) <= bound
    # 24 micro-batches, 6 cycles: the optimizer and the schedule each stepped 6 times, not 24.
    assert scheduler.last_epoch == STEPS == ref_scheduler.last_epoch
    assert scheduler.get_last_lr() == pytest.approx([0.1 * 0.5**STEPS])


def test_backward_divides_loss_and_holds_the_step():
    """backward() divides the loss over the accumulation cycle, and the step is held until the cycle ends."""
    accelerator = Accelerator("cpu", gradient_accumulation_steps=2)
    model = make_model()
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    before = copy.deepcopy(model)
    features, labels = make_data(8)[:]
    with accelerator.accumulate(model):
        accelerator.backward(F.cross_entropy(model(features), labels))
        first_grad = model[0].weight.grad.clone()
        optimizer.step()
        optimizer.zero_grad()
    assert not accelerator.sync_gradients
    assert max_difference(before, model) == 0  # held: the cycle is not over
    assert model[0].weight.grad is not None  # zero_grad held too: the gradients keep adding up
    expected = torch.autograd.grad(F.cross_entropy(before(features), labels), before[0].weight)[0] / 2
    assert torch.allclose(first_grad, expected, atol=1e-7)
    with accelerator.accumulate(model):
        accelerator.backward(F.cross_entropy(model(features), labels))
        optimizer.step()
    assert accelerator.sync_gradients and max_difference(before, model) > 0


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_clip_grad_norm_matches_torch(precision):
    reference, candidate = make_model(), make_model()
    features, labels = make_data(32)[:]
    F.cross_entropy(reference(features), labels).backward()
    expected_norm = nn.utils.clip_grad_norm_(reference.parameters(), 0.1)

    accelerator = Accelerator("cpu", precision)
    model, optimizer = accelerator.prepare(candidate, torch.optim.SGD(candidate.parameters(), lr=0.1))
    with accelerator.autocast():
        loss = F.cross_entropy(model(features).float(), labels)
    accelerator.backward(loss)
    norm = accelerator.clip_grad_norm_(model.parameters(), 0.1)

    tolerance = 0 if precision == "fp32" else 5e-3
    assert norm.item() == pytest.approx(expected_norm.item(), rel=tolerance, abs=tolerance * 1e-2)
    assert norm.item() > 0.1  # it did clip
    for expected, actual in zip(reference.parameters(), model.parameters()):
        assert torch.allclose(expected.grad, actual.grad, rtol=tolerance, atol=tolerance * 1e-2)
    if precision == "fp16":
        # The gradients were unscaled once; the step must not unscale them again.
        grads = [p.grad.clone() for p in model.parameters()]
        weights = [p.detach().clone() for p in model.parameters()]
        optimizer.step()
        for weight, grad, param in zip(weights, grads, model.parameters()):
            assert torch.allclose(param, weight - 0.1 * grad, atol=1e-7)


def test_fp16_skips_inf_steps_and_lowers_the_scale():
    """fp16 skips the step with an inf gradient and lowers the scale."""
    accelerator = Accelerator("cpu", "fp16")
    model = make_model()
    raw_optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(raw_optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, raw_optimizer, scheduler)
    features, labels = make_data(32)[:]
    scale = accelerator.scaler.get_scale()
    before = copy.deepcopy(model)

    with accelerator.autocast():
        accelerator.backward(F.cross_entropy(model(features).float(), labels))
    model[0].weight.grad[0, 0] = float("inf")  # an overflow in one gradient
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    assert accelerator.optimizer_step_was_skipped
    assert max_difference(before, model) == 0
    assert accelerator.scaler.get_scale() == scale / 2
    assert scheduler.last_epoch == 0  # the schedule did not advance past a step that did not happen

    with accelerator.autocast():
        accelerator.backward(F.cross_entropy(model(features).float(), labels))
    optimizer.step()
    scheduler.step()
    assert not accelerator.optimizer_step_was_skipped
    assert max_difference(before, model) > 0 and scheduler.last_epoch == 1


def test_save_state_then_load_state_resumes_exactly(tmp_path):
    accelerator = Accelerator("cpu", gradient_accumulation_steps=1)
    model = make_model(dropout=0.3)  # dropout: the resumed run must also get the same random masks
    raw_optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(raw_optimizer, step_size=1, gamma=0.9)
    model, optimizer, scheduler = accelerator.prepare(model, raw_optimizer, scheduler)
    loader = DataLoader(make_data(64), batch_size=32)
    set_seed(3)
    accelerated_loop(accelerator, model, optimizer, loader, scheduler)
    accelerator.save_state(tmp_path / "state")
    accelerated_loop(accelerator, model, optimizer, loader, scheduler)
    after = copy.deepcopy(model)

    accelerated_loop(accelerator, model, optimizer, loader, scheduler)  # wander off
    accelerator.load_state(tmp_path / "state")
    assert scheduler.last_epoch == 2
    accelerated_loop(accelerator, model, optimizer, loader, scheduler)
    assert max_difference(after, model) == 0
    # The runner's checkpoint format: a manifest (written last) verifies every file; RNG states are in state.pt.
    assert sorted(path.name for path in (tmp_path / "state").iterdir()) == [
        "manifest.json", "model_0.safetensors", "state.pt"
    ]
    assert damage(tmp_path / "state") is None and not list(tmp_path.glob(".partial-*"))


def test_prepare_returns_what_it_does_not_prepare_unchanged():
    """As Accelerate's prepare: scripts pass other objects (a list, a tokenizer) through it."""
    given, listed = {"not": "preparable"}, [nn.Linear(2, 2)]
    prepared = Accelerator("cpu").prepare(given, listed)
    assert prepared[0] is given and prepared[1] is listed


def test_accelerate_argument_names_and_properties():
    accelerator = Accelerator("cpu", mixed_precision="no", gradient_accumulation_steps=3)
    assert accelerator.mixed_precision == "no" and accelerator.gradient_accumulation_steps == 3
    assert [Accelerator("cpu", precision).mixed_precision for precision in ("fp32", "bf16", "fp16")] == \
        ["no", "bf16", "fp16"]
    assert Accelerator("cpu", mixed_precision="bf16").precision.autocast_dtype is torch.bfloat16
    assert accelerator.process_index == 0 and accelerator.num_processes == 1 and accelerator.is_local_main_process
    assert "device cpu | precision fp32 | autocast off | grad scaler off" in accelerator.describe()
    assert "grad scaler on" in Accelerator("cpu", "fp16").describe()


def test_unwrap_model_removes_compile_and_ddp_wrappers():
    model = make_model()
    compiled_like = types.SimpleNamespace(_orig_mod=model)
    assert Accelerator("cpu").unwrap_model(compiled_like, keep_torch_compile=False) is model
    assert Accelerator("cpu").unwrap_model(compiled_like) is compiled_like  # Accelerate's default keeps it
    assert Accelerator("cpu").unwrap_model(model) is model


def test_print_and_collectives_in_a_single_process(capsys):
    Accelerator("cpu").print("main")
    Accelerator("cpu", dist=DistInfo(rank=1, local_rank=1, world_size=2)).print("other")
    assert capsys.readouterr().out == "main\n"
    accelerator = Accelerator("cpu")
    assert accelerator.gather(torch.tensor([1, 2])).tolist() == [1, 2]
    assert accelerator.gather_for_metrics({"a": torch.tensor([3])})["a"].tolist() == [3]
    assert accelerator.reduce(torch.tensor(2.0), "mean").item() == 2.0
    with accelerator.main_process_first():
        accelerator.wait_for_everyone()


def test_set_seed_device_specific_offsets_by_rank():
    Accelerator("cpu", dist=DistInfo(rank=1, local_rank=1, world_size=2)).set_seed(5, device_specific=True)
    first = torch.rand(3)
    set_seed(6)
    assert torch.equal(first, torch.rand(3))


def test_two_gloo_processes_collect_and_accumulate(tmp_path):
    from dist_workers import all_checks, launch

    results = launch(all_checks, str(tmp_path))
    ranks = [results[0]["collectives"], results[1]["collectives"]]
    for rank, result in enumerate(ranks):
        assert result["gather"] == [0, 10, 1, 11]
        assert result["gather_uneven"] == [0, 0, 1]
        assert result["gather_dict"] == [0, 1]
        assert (result["reduce_sum"], result["reduce_mean"], result["reduce_max"]) == (3.0, 1.5, 2.0)
        assert result["is_main"] == (rank == 0)
        assert result["saw_main_first"]
        # 5 samples on 2 ranks: the sampler repeats one to even out; gather_for_metrics counts each once.
        assert sorted(result["metrics_samples"]) == [0, 1, 2, 3, 4]
        assert sorted(result["metrics_samples_even"]) == list(range(8))

    accumulation = [results[0]["accumulation"], results[1]["accumulation"]]
    assert accumulation[0]["syncs"] == [False, True]
    grads = accumulation[0]["grads"]  # [micro step][rank][out][in], gathered from both ranks
    # Micro-step 1 (no_sync): each rank keeps its own gradient (mean over the cycle: x / 2 per row pair).
    assert grads[0][0][0] == [1.0] * 4 and grads[0][1][0] == [2.0] * 4
    # Micro-step 2 syncs: both ranks hold the average of their accumulated gradients, (1 + 2 + 2 + 3) / 2.
    assert grads[1][0] == grads[1][1] == [[4.0] * 4]
    assert accumulation[0]["weight"] == accumulation[1]["weight"]


class FakeXla:
    """A stand-in for torch_xla that records the calls the TPU path makes."""

    def __init__(self, monkeypatch):
        self.calls = []
        root = types.ModuleType("torch_xla")
        root.device = lambda: torch.device("cpu")
        root.sync = lambda: self.calls.append("sync")
        xla_model = types.ModuleType("torch_xla.core.xla_model")
        xla_model.optimizer_step = self.optimizer_step
        parallel_loader = types.ModuleType("torch_xla.distributed.parallel_loader")
        parallel_loader.MpDeviceLoader = self.device_loader
        for name, module in {
            "torch_xla": root, "torch_xla.core": types.ModuleType("torch_xla.core"), "torch_xla.core.xla_model": xla_model,
            "torch_xla.distributed": types.ModuleType("torch_xla.distributed"),
            "torch_xla.distributed.parallel_loader": parallel_loader,
        }.items():
            monkeypatch.setitem(sys.modules, name, module)

    def optimizer_step(self, optimizer):
        self.calls.append("optimizer_step")
        optimizer.step()

    def device_loader(self, batches, device):
        self.calls.append(f"MpDeviceLoader({device})")
        return batches


def test_tpu_path_steps_and_loads_through_torch_xla(monkeypatch):
    fake = FakeXla(monkeypatch)
    reference, candidate = make_model(), make_model()
    plain_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1), DataLoader(make_data(64), batch_size=32))

    accelerator = Accelerator("xla")
    model, optimizer, loader = accelerator.prepare(
        candidate, torch.optim.SGD(candidate.parameters(), lr=0.1), DataLoader(make_data(64), batch_size=32)
    )
    assert len(loader) == 2
    accelerated_loop(accelerator, model, optimizer, loader)
    assert fake.calls == ["MpDeviceLoader(cpu)", "optimizer_step", "sync", "optimizer_step", "sync"]
    assert max_difference(reference, candidate) == 0


# -- the standard loop, through the CLI: grad_accum_steps, max_grad_norm and precision come from the config --------


def _final_val_loss(result) -> float:
    from conftest import read_scalars

    assert result.returncode == 0, result.output
    return read_scalars(result.run_dir(), "val/loss")[-1][1]


class RecordingLogger:
    def __init__(self):
        self.rows = []

    def log(self, step, metrics):
        self.rows.append((step, metrics))


def run_loop(batch_size: int, grad_accum_steps: int, steps: int = 3):
    """The standard Loop in this process over a small classification set; returns (train losses, model)."""
    from runner.data.batches import TensorBatches
    from runner.training.loop import Loop
    from runner.training.metrics import Progress
    from runner.training.checkpointer import Checkpointer
    from runner.config import TrainerConfig
    from runner.training.batch_plan import BatchPlan
    from runner.training.tasks import Classification

    features, labels = make_data(256)[:]
    columns = {"features": features, "label": labels}
    settings = TrainerConfig(batch_size=batch_size, grad_accum_steps=grad_accum_steps, max_steps=steps,
                             log_every_steps=1, progress_bar=False)
    accelerator = Accelerator("cpu", grad_accum_steps=grad_accum_steps)
    model = make_model()
    model, optimizer, train, val = accelerator.prepare(
        model, torch.optim.SGD(model.parameters(), lr=0.1),
        TensorBatches(columns, batch_size, shuffle=True, seed=0), TensorBatches(columns, 64, shuffle=False, seed=0),
    )
    logger = RecordingLogger()
    Loop(accelerator, model, optimizer, None, train, val, Classification(), settings,
         BatchPlan(batch_size, grad_accum_steps, processes=1), logger=logger,
         progress=Progress(steps, enabled=False), checkpointer=Checkpointer.disabled()).fit()
    return [metrics["train/loss"] for _, metrics in logger.rows if "train/loss" in metrics], model


def test_loop_accumulating_4x8_matches_batches_of_32():
    losses, model = run_loop(batch_size=32, grad_accum_steps=1)
    accumulated_losses, accumulated_model = run_loop(batch_size=8, grad_accum_steps=4)
    assert len(losses) == 3
    for accumulated, whole in zip(accumulated_losses, losses):  # each a mean of 32 rows, summed in another order
        assert abs(accumulated - whole) <= reordered_sum_bound(32, abs(whole)), (accumulated_losses, losses)
    moved = max_difference(model, make_model())
    assert 0 < moved and max_difference(model, accumulated_model) <= reordered_sum_bound(32, moved)


def test_fp16_loop_clips_and_logs_the_grad_norm(cli):
    from conftest import TINY, read_scalars

    result = cli(*TINY, "precision=fp16", "trainer.max_grad_norm=0.5", "trainer.max_steps=3", "trainer.log_every_steps=1")
    assert result.returncode == 0, result.output
    norms = read_scalars(result.run_dir(), "train/grad_norm")
    assert [step for step, _ in norms] == [1, 2, 3]
    # Unscaled before clipping: a real norm (a few units), not one multiplied by the 65536 loss scale.
    assert all(0 < value < 100 for _, value in norms)
    log = (result.run_dir() / "runner.log").read_text()
    assert "device cpu | precision fp16 | autocast float16 | grad scaler on | 1 process(es)" in log
    assert "precision=fp16 on a CPU runs slower than fp32" in log


def test_fp8_emulation_trains_and_counts_modules(cli):
    """fp8 emulation trains and reports the converted modules."""
    from conftest import TINY

    result = cli(*TINY, "precision=fp8", "precision.fp8_emulation=true", "trainer.max_steps=2")
    log = (result.run_dir() / "runner.log").read_text()
    # SeqTransformer: attention out_proj, linear1, linear2 in each of 2 layers; the 64->10 head is not divisible by 16.
    assert "precision fp8 | autocast bfloat16 | grad scaler off | fp8 modules converted 6" in log
    assert 0 < _final_val_loss(result) < 5


def test_two_processes_accumulating_match_one(cli, tmp_path):
    """Two gloo processes with accumulation match one process with the whole batch."""
    from conftest import TINY

    # A schedule that moves every step: 2 processes must step it once per optimizer step, as one process does (the
    # runner's batches are split batches; stepped Accelerate's N times per step, the losses would differ).
    # SGD: its steps are linear in the gradients, so the summation order's rounding stays within the bound below.
    common = (*TINY, "trainer.max_steps=2", "scheduler=warmup_cosine", "scheduler.warmup_steps=4", "optimizer=sgd")
    # A global batch of 128: 2 processes x 2 micro-batches of 32 take the same 128 rows per step as one process.
    one = cli(*common, "trainer.batch_size=128", cwd=(tmp_path / "one").mkdir() or tmp_path / "one")
    two = cli(*common, "trainer.batch_size=128", "hardware=multi_cpu", "hardware.start_method=fork",
              "trainer.grad_accum_steps=2", cwd=(tmp_path / "two").mkdir() or tmp_path / "two")
    assert "batch: 128 global per optimizer step = 32 per device x 2 process(es) x 2 accumulation step(s)" in \
        (two.run_dir() / "runner_rank0.log").read_text()
    # Each step sums 128 rows x 12 tokens in another order; the relative rounding carries into the loss.
    single = _final_val_loss(one)
    assert abs(_final_val_loss(two) - single) <= reordered_sum_bound(128 * 12, single), (_final_val_loss(two), single)


def test_tree_map_keeps_namedtuples_and_dataclasses():
    """Batches of namedtuples and dataclasses move every tensor and keep their type."""
    import dataclasses
    from collections import namedtuple

    from runner.accelerate.prepared import tree_map

    Pair = namedtuple("Pair", "inputs targets")

    @dataclasses.dataclass
    class Batch:
        pair: Pair
        mask: torch.Tensor
        name: str = "b"

    batch = {"x": [Batch(Pair(torch.ones(2), torch.zeros(2)), torch.ones(1))], "n": 3}
    moved = tree_map(lambda tensor: tensor + 1, batch)
    inner = moved["x"][0]
    assert isinstance(inner, Batch) and isinstance(inner.pair, Pair) and inner.name == "b" and moved["n"] == 3
    assert inner.pair.inputs.tolist() == [2.0, 2.0] and inner.pair.targets.tolist() == [1.0, 1.0]
    assert inner.mask.tolist() == [2.0]


def test_load_state_names_a_missing_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    accelerator = Accelerator()
    accelerator.prepare(torch.nn.Linear(2, 2))
    with pytest.raises(CheckpointError, match=rf"load_state: no_such_dir is not a directory \(looked in {tmp_path}\)"):
        accelerator.load_state("no_such_dir")


@pytest.mark.parametrize("arguments, message", [
    (dict(gradient_accumulation_steps=0), r"Accelerator\(gradient_accumulation_steps\): is 0; it must be a whole"),
    (dict(gradient_accumulation_steps=-1), r"is -1; it must be a whole number, 1 or more"),  # -1 trained as 1
    (dict(gradient_accumulation_steps="2"), r"is '2'; it must be a whole number"),
    (dict(grad_accum_steps=2, gradient_accumulation_steps=4), r"is 4 and grad_accum_steps is 2: give the count once"),
    (dict(mixed_precision="fp15"), r"Accelerator\(mixed_precision\): is 'fp15'; choose one of fp32, fp16, bf16, fp8"),
    (dict(precision="fp32", mixed_precision="bf16"), r"is 'fp32' and mixed_precision is 'bf16': give the precision"),
    (dict(device="gpu"), r"Accelerator\(device\): is 'gpu', which torch does not know as a device"),
])
def test_bad_arguments_are_named(arguments, message):
    """Each was taken silently (a count of 0 or -1 became 1, a conflict picked one side) or failed in torch."""
    with pytest.raises(ConfigError, match=message):
        Accelerator(**arguments)


@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts what a machine without CUDA says")
def test_cuda_without_a_gpu_is_named_at_once():
    with pytest.raises(HardwareError, match=r"Accelerator\(device='cuda'\): this torch cannot use a CUDA GPU here"):
        Accelerator("cuda")


def test_forked_workers_on_a_python_with_the_fork_deadlock_are_named():
    """CPython gh-112275 (runner/accelerate/dataloader.py): only forked workers of a multi-process run, only on
    3.10 before 3.10.15 and 3.11 before 3.11.10; the message names the fix and the way around it."""
    from runner.accelerate.dataloader import fork_deadlock_risk

    forked = DataLoader(range(4), num_workers=2, multiprocessing_context="fork")
    message = fork_deadlock_risk(forked, 2, (3, 11, 7))
    assert message.startswith("DataLoader(num_workers=2) forks its workers, and on Python 3.11.7 a worker forked")
    assert "(CPython gh-112275, fixed in Python 3.11.10): upgrade Python, or give the DataLoader " \
           'multiprocessing_context="forkserver"' in message
    assert "fixed in Python 3.10.15" in fork_deadlock_risk(forked, 2, (3, 10, 14))
    for version in ((3, 11, 10), (3, 10, 15), (3, 12, 1), (3, 13, 0)):
        assert fork_deadlock_risk(forked, 2, version) == "", version
    assert fork_deadlock_risk(forked, 1, (3, 11, 7)) == ""
    assert fork_deadlock_risk(DataLoader(range(4)), 2, (3, 11, 7)) == ""
    spawned = DataLoader(range(4), num_workers=2, multiprocessing_context="spawn")
    assert fork_deadlock_risk(spawned, 2, (3, 11, 7)) == ""
