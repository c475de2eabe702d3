"""Functions that 2 gloo processes run under torch's elastic launcher in tests (importable, so spawn can find them).

Each returns plain Python values; the test asserts on the {rank: value} the launcher hands back.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runner.accelerate.accelerator import Accelerator
from runner.distributed.dist import DistInfo, destroy_process_group, init_process_group


def launch(fn, *args, nproc: int = 2) -> dict:
    """Run fn(*args) in nproc gloo processes, as the runner's launcher does (port 0: never collides)."""
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"test-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, start_method="fork",  # fork: 0.3 s a launch against seconds for spawn; CPU only
    )
    return elastic_launch(config, fn)(*args)


def all_checks(tmp_dir: str) -> dict:
    """One launch (starting processes costs seconds) for every check: collectives, then accumulation."""
    torch.set_num_threads(1)
    init_process_group(DistInfo.from_env(), "gloo")
    try:
        return {"collectives": collectives(tmp_dir), "accumulation": accumulation(grad_accum_steps=2)}
    finally:
        destroy_process_group()


def collectives(tmp_dir: str) -> dict:
    accelerator = Accelerator("cpu")
    rank = accelerator.process_index
    result = {
        "gather": accelerator.gather(torch.tensor([rank, rank + 10])).tolist(),
        "gather_uneven": accelerator.gather(torch.arange(rank + 1)).tolist(),
        "gather_dict": accelerator.gather({"x": torch.tensor([rank])})["x"].tolist(),
        "reduce_sum": accelerator.reduce(torch.tensor(float(rank + 1))).item(),
        "reduce_mean": accelerator.reduce(torch.tensor(float(rank + 1)), "mean").item(),
        "reduce_max": accelerator.reduce(torch.tensor(float(rank + 1)), "max").item(),
        "is_main": accelerator.is_main_process,
    }
    marker = Path(tmp_dir) / "main_was_here"
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            time.sleep(0.5)  # a slow download: the other rank must wait for it
            marker.write_text("done")
        result["saw_main_first"] = marker.exists()
    accelerator.wait_for_everyone()
    result["metrics_samples"] = _gathered_eval_samples(accelerator, num_samples=5, batch_size=2)
    result["metrics_samples_even"] = _gathered_eval_samples(accelerator, num_samples=8, batch_size=2)
    return result


def _gathered_eval_samples(accelerator: Accelerator, num_samples: int, batch_size: int) -> list[int]:
    """Every sample id seen by gather_for_metrics over a sharded loader (5 samples: the sampler pads one)."""
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(num_samples)), batch_size=batch_size))
    seen = []
    for (ids,) in loader:
        seen += accelerator.gather_for_metrics(ids).tolist()
    return seen


def accumulation(grad_accum_steps: int) -> dict:
    """DDP + accumulate(): gradients stay local (differ across ranks) until the cycle's last micro-step syncs them."""
    info = DistInfo.from_env()
    torch.manual_seed(0)
    accelerator = Accelerator("cpu", gradient_accumulation_steps=grad_accum_steps)
    model = accelerator.prepare(nn.Linear(4, 1))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    grads, syncs = [], []
    for micro in range(grad_accum_steps):
        inputs = torch.full((2, 4), float(info.rank + 1 + micro))  # each rank sees different data
        with accelerator.accumulate(model):
            accelerator.backward(model(inputs).sum())
            syncs.append(accelerator.sync_gradients)
            grads.append(accelerator.gather(model.module.weight.grad.clone().unsqueeze(0)).tolist())
            optimizer.step()
            optimizer.zero_grad()
    return {"syncs": syncs, "grads": grads, "weight": model.module.weight.detach().tolist()}
