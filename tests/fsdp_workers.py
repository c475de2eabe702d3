"""What 2 gloo processes run (under torch's elastic launcher, tests/dist_workers.py's `launch`) to check
parallel=fsdp through the Accelerator against one process training on the global batch.

Each function returns plain Python values; the tests in tests/accelerate/test_parallel.py assert on them.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from runner.accelerate.accelerator import Accelerator
from runner.checkpoint import sharded
from runner.data.batches import TensorBatches
from runner.config import ActivationCheckpointingConfig, CompileConfig, ParallelConfig, ParallelKind
from runner.distributed.dist import DistInfo, destroy_process_group, init_process_group
from runner.models import GPT
from runner.training.tasks import LanguageModeling
from runner.accelerate.parallel import prepare_blocks

STEPS, ROWS, LR = 4, 8, 1e-2  # 4 optimizer steps on a global batch of 8 sequences
TOKENS_PER_STEP = ROWS * 8  # the terms each optimizer step's gradient sums (block_size 8), in any layout


def adamw(parameters):
    return torch.optim.AdamW(parameters, lr=LR)


def sgd_momentum(parameters):
    """For the equivalence checks: its weight change is linear in the gradients, so two summation orders leave
    differences that scale with (n - 1) * eps (tests/tolerances.py); Adam's normalisation would not."""
    return torch.optim.SGD(parameters, lr=0.5, momentum=0.9)


def tiny_gpt(seed: int = 0, dropout: float = 0.0) -> GPT:
    """Blocks in an nn.ModuleList and a head tied to the embedding: what FSDP's defaults and its exports meet."""
    torch.manual_seed(seed)
    return GPT(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=32, dropout=dropout)


def global_batch(step: int) -> torch.Tensor:
    return torch.randint(0, 16, (ROWS, 8), generator=torch.Generator().manual_seed(step))


def loss_of(model, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(tokens).flatten(0, 1).float(), tokens.flatten())


def reference(steps: int = STEPS, max_norm: float | None = None, make_optimizer=adamw) -> tuple[dict, list[float]]:
    """One process, the whole global batch per step: the weights and gradient norms every layout must match."""
    model = tiny_gpt()
    optimizer = make_optimizer(model.parameters())
    norms = []
    for step in range(steps):
        loss_of(model, global_batch(step)).backward()
        if max_norm is not None:
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        optimizer.step()
        optimizer.zero_grad()
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}, norms


def train(accelerator: Accelerator, model, steps: int = STEPS, max_norm: float | None = None, first_step: int = 0,
          make_optimizer=adamw):
    """The hand-written loop (accumulate/autocast/backward/clip): this rank's rows of each global batch, split into
    the accelerator's micro-batches. The optimizer is built before prepare(), as Accelerate users do."""
    optimizer = make_optimizer(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    return model, optimizer, run_steps(accelerator, model, optimizer, steps, max_norm, first_step)


def run_steps(accelerator, model, optimizer, steps, max_norm=None, first_step=0) -> dict:
    rank, world, micro = accelerator.process_index, accelerator.num_processes, accelerator.gradient_accumulation_steps
    norms, losses = [], []
    for step in range(first_step, first_step + steps):
        for tokens in global_batch(step)[rank::world].chunk(micro):
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    loss = loss_of(model, tokens)
                accelerator.backward(loss)
                losses.append(float(loss))
                if accelerator.sync_gradients and max_norm is not None:
                    norms.append(float(accelerator.clip_grad_norm_(model.parameters(), max_norm)))
                optimizer.step()
                optimizer.zero_grad()
    return {"norms": norms, "losses": losses}


def max_difference(weights: dict, expected: dict) -> float:
    assert weights.keys() == expected.keys(), sorted(set(weights) ^ set(expected))
    return max(float((weights[name] - expected[name]).abs().max()) for name in expected)


def gathered(model) -> dict:
    return sharded.full_weights(model, distributed=True)


def fsdp_checks(tmp_dir: str) -> dict:
    """Every check in one launch (starting processes costs seconds)."""
    torch.set_num_threads(1)
    init_process_group(DistInfo.from_env(), "gloo")
    try:
        return {**equivalence(), "bf16": bf16_policy(), **state_round_trip(Path(tmp_dir)), **blocks(),
                "memory": memory(), "following": optimizer_following(), "evaluation": evaluation(),
                "saved": saved_model(Path(tmp_dir))}
    finally:
        destroy_process_group()


def equivalence() -> dict:
    """FSDP and DDP against one process: plain, then with clipping and 2 accumulated micro-batches. SGD with
    momentum (see sgd_momentum); "moved" is how far one process moved the weights, the scale of the bound."""
    plain, _ = reference(make_optimizer=sgd_momentum)
    clipped, reference_norms = reference(max_norm=0.5, make_optimizer=sgd_momentum)
    initial = tiny_gpt().state_dict()
    results = {"moved": max_difference(plain, initial), "clipped_moved": max_difference(clipped, initial)}
    for kind in ("fsdp", "ddp"):
        model, _, _ = train(Accelerator("cpu", parallel=kind), tiny_gpt(), make_optimizer=sgd_momentum)
        weights = gathered(model) if kind == "fsdp" else {k: v.detach() for k, v in model.module.state_dict().items()}
        results[kind] = {"diff": max_difference(weights, plain) if weights else None,
                         "parameter_type": type(next(model.parameters())).__name__}
    # The options: blocks named by class, parameters kept gathered from forward to backward.
    options = ParallelConfig(kind=ParallelKind.fsdp, shard_modules=["Block"], reshard_after_forward=False)
    model, _, _ = train(Accelerator("cpu", parallel=options), tiny_gpt(), make_optimizer=sgd_momentum)
    weights = gathered(model)
    results["fsdp_options"] = {"diff": max_difference(weights, plain) if weights else None,
                               "units": sorted(type(module).__name__ for module in model.modules()
                                               if type(module).__name__.startswith("FSDP"))}
    model, _, log = train(Accelerator("cpu", parallel="fsdp", gradient_accumulation_steps=2), tiny_gpt(), max_norm=0.5,
                          make_optimizer=sgd_momentum)
    weights = gathered(model)
    results["fsdp_clip_accumulate"] = {
        "diff": max_difference(weights, clipped) if weights else None,
        "norm_diff": max(abs(a - b) for a, b in zip(log["norms"], reference_norms)),
        "largest_norm": max(reference_norms),
        "norms": len(log["norms"]),
    }
    results["local_shard_rows"] = next(model.parameters()).to_local().shape[0]
    results["full_rows"] = next(model.parameters()).shape[0]
    return results


def saved_model(tmp_dir: Path) -> str:
    """Accelerator.save_model under FSDP, in shards of at most 20 kB: every process calls it, rank 0 writes."""
    accelerator = Accelerator("cpu", parallel="fsdp")
    model, _, _ = train(accelerator, tiny_gpt(), make_optimizer=sgd_momentum)  # against reference(): see equivalence
    accelerator.save_model(model, tmp_dir / "saved", max_shard_size="20KB")
    return ",".join(sorted(path.name for path in (tmp_dir / "saved").iterdir()))


def evaluation() -> dict:
    """The loop's evaluate() on validation splits of 1 row (process 1's shard is empty) and 3 rows (2 batches and
    1), under FSDP and DDP: {"rows<N>": {kind: metrics}}, to match one process's."""
    from runner.training.loop import evaluate

    results = {}
    for rows in (1, 3):
        for kind in ("fsdp", "ddp"):
            accelerator = Accelerator("cpu", parallel=kind)
            model = accelerator.prepare(tiny_gpt())
            batches = accelerator.prepare(evaluation_batches(rows))
            results.setdefault(f"rows{rows}", {})[kind] = evaluate(accelerator, model, batches, LanguageModeling())
    return results


def evaluation_batches(rows: int) -> TensorBatches:
    tokens = global_batch(100)[:rows]
    return TensorBatches({"input_ids": tokens, "labels": tokens}, batch_size=1, shuffle=False, seed=0)


def bf16_policy() -> dict:
    """precision=bf16 under FSDP: fp32 shards (what the optimizer steps), bf16 compute, fp32 gradients."""
    accelerator = Accelerator("cpu", precision="bf16", parallel="fsdp")
    model = tiny_gpt()
    seen = []
    model.blocks[0].attn.qkv.register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    with accelerator.autocast():
        loss = loss_of(model, global_batch(0)[accelerator.process_index::2])
    accelerator.backward(loss)
    grads = {str(parameter.grad.dtype) for parameter in model.parameters()}
    optimizer.step()
    optimizer.zero_grad()
    run_steps(accelerator, model, optimizer, STEPS - 1, first_step=1)
    weights, plain = gathered(model), reference()[0]
    initial = tiny_gpt().state_dict()
    result = {"compute": str(seen[0]), "shards": str(next(model.parameters()).dtype), "grads": sorted(grads)}
    if weights:  # rank 0: how far from fp32 training, against how far fp32 training moved the weights (L2)
        result["diff"] = sum(float((weights[name] - plain[name]).square().sum()) for name in plain) ** 0.5
        result["moved"] = sum(float((plain[name] - initial[name]).square().sum()) for name in plain) ** 0.5
    return result


def state_round_trip(tmp_dir: Path) -> dict:
    """save_state/load_state under FSDP: bitwise continuation; a state saved by one process loads on two."""
    accelerator = Accelerator("cpu", parallel="fsdp")
    model, optimizer, _ = train(accelerator, tiny_gpt(), steps=2)
    accelerator.save_state(tmp_dir / "two")
    saved = gathered(model)
    if saved:  # rank 0: what one process must find when it loads the state (tests/accelerate/test_parallel.py)
        torch.save(saved, tmp_dir / "two_weights.pt")
    run_steps(accelerator, model, optimizer, 2, first_step=2)
    continued = gathered(model)
    run_steps(accelerator, model, optimizer, 1, first_step=7)  # wander off
    accelerator.load_state(tmp_dir / "two")
    run_steps(accelerator, model, optimizer, 2, first_step=2)
    again = gathered(model)

    # one -> two: tests/accelerate/test_parallel.py saved tmp_dir/one from one process, with its weights beside it.
    loader = Accelerator("cpu", parallel="fsdp")
    resharded, _, _ = train(loader, tiny_gpt(seed=5), steps=0)
    loader.load_state(tmp_dir / "one")
    expected = torch.load(tmp_dir / "one_weights.pt", weights_only=True)
    loaded = gathered(resharded)
    return {"continued_bitwise": (max_difference(again, continued) == 0.0) if again else None,
            "one_to_two": max_difference(loaded, expected) if loaded else None}


def blocks() -> dict:
    """Activation checkpointing and torch.compile (aot_eager: no C++ compile) on the blocks FSDP shards: the same
    losses as plain FSDP; the sharded state names parameters without the compile wrapper's `_orig_mod.`."""
    results = {}
    for name, checkpointing, compiling in (("plain", False, False), ("checkpointed", True, False),
                                           ("compiled", True, True)):
        model = prepare_blocks(tiny_gpt(dropout=0.0), ActivationCheckpointingConfig(enabled=checkpointing),
                               CompileConfig(enabled=compiling, backend="aot_eager"), ParallelConfig(), sharded=True)
        accelerator = Accelerator("cpu", parallel="fsdp")
        model, _, log = train(accelerator, model, steps=2)
        results[name] = log["losses"]
        if compiling:
            results["compiled_names"] = sorted(sharded.model_state(model))
            results["wrapped"] = type(model.blocks[0]).__name__
    return {"blocks": results}


def held_bytes(model, optimizer) -> dict:
    """Bytes this process really holds: its shards (DTensor's local tensor) of the weights, of their gradients
    and of the optimizer's state."""
    local = lambda tensor: tensor.to_local() if hasattr(tensor, "to_local") else tensor  # noqa: E731
    size = lambda tensors: sum(local(t).numel() * local(t).element_size() for t in tensors)  # noqa: E731
    parameters = list(model.parameters())
    return {"weights": size(parameters), "gradients": size(p.grad for p in parameters),
            "optimizer": size(value for state in optimizer.state.values() for value in state.values()
                              if torch.is_tensor(value))}


def memory() -> dict:
    """What rank 0 holds after one AdamW step, for runner plan's figures (runner/accelerate/memory.py) to be checked against.
    A vocabulary of 17 gives the (tied) embedding 17 rows, split 9 + 8: the uneven split is checked too."""
    torch.manual_seed(0)
    model = GPT(vocab_size=17, block_size=8, n_layer=3, n_head=2, n_embd=32, dropout=0.0)
    accelerator = Accelerator("cpu", parallel="fsdp")
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    whole = weakref.ref(model.blocks[0].mlp[0].weight)
    model, optimizer = accelerator.prepare(model, optimizer)
    loss_of(model, torch.randint(0, 17, (2, 8))).backward()
    optimizer.step()
    # The whole parameter the shards replaced is gone (nothing, the Accelerator included, keeps it alive).
    return {**held_bytes(model, optimizer), "whole_parameter_freed": whole() is None}


def optimizer_following() -> dict:
    """An optimizer prepared in a later prepare() call than its model still steps the shards; one that already
    stepped on the whole parameters is refused (its state would belong to tensors that are gone)."""
    accelerator = Accelerator("cpu", parallel="fsdp")
    accelerator.prepare(tiny_gpt())
    optimizer = accelerator.prepare(torch.optim.AdamW(tiny_gpt().parameters(), lr=LR))  # another model's: untouched
    later_model = tiny_gpt()
    later_optimizer = torch.optim.AdamW(later_model.parameters(), lr=LR)
    later_model = accelerator.prepare(later_model)
    later_optimizer = accelerator.prepare(later_optimizer)
    stepped_model = tiny_gpt()
    stepped = torch.optim.AdamW(stepped_model.parameters(), lr=LR)
    loss_of(stepped_model, global_batch(0)).backward()
    stepped.step()
    accelerator.prepare(stepped_model)
    try:
        accelerator.prepare(stepped)
        refused = None
    except TypeError as err:
        refused = str(err)
    follows = all(any(p is q for q in later_model.parameters()) for group in later_optimizer.param_groups
                  for p in group["params"])
    untouched = not any(type(p).__name__ == "DTensor" for group in optimizer.param_groups for p in group["params"])
    return {"follows": follows, "untouched": untouched, "refused": refused}
