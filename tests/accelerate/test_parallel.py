"""runner.accelerate.parallel: FSDP through the Accelerator on 2 gloo processes against one process with the global batch
(and DDP), clipping, accumulation, the bf16 policy, sharded save_state/load_state across process counts; the
blocks, activation checkpointing (equal gradients, less memory) and torch.compile (same loss, own names)."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import pytest
import torch
from torch import nn

import fsdp_workers
from dist_workers import launch
from tolerances import reordered_sum_bound
from runner.accelerate.accelerator import Accelerator
from runner.run.checks import check
from runner.run.compose import load
from runner.config import ActivationCheckpointingConfig, CompileConfig, ParallelConfig, ParallelKind, PrecisionKind
from runner.errors import ConfigError
from runner.accelerate.memory import memory_plan
from runner.models import GPT, MLP, SeqTransformer
from runner.accelerate.parallel import checkpoint_blocks, compile_model, find_blocks, prepare_blocks


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    """One launch of 2 processes for every FSDP check; before it, one process saves a state they must load."""
    tmp_dir = tmp_path_factory.mktemp("fsdp")
    accelerator = Accelerator("cpu", parallel="fsdp")
    model, _, _ = fsdp_workers.train(accelerator, fsdp_workers.tiny_gpt(seed=3), steps=2)
    accelerator.save_state(tmp_dir / "one")
    torch.save({name: tensor.detach().clone() for name, tensor in model.state_dict().items()},
               tmp_dir / "one_weights.pt")
    return launch(fsdp_workers.fsdp_checks, str(tmp_dir)), tmp_dir


def test_fsdp_and_ddp_train_as_one_process(fsdp):
    """FSDP trains what one process trains on the global batch, and so does DDP."""
    results, _ = fsdp
    main = results[0]
    assert main["fsdp"]["parameter_type"] == "DTensor" and main["ddp"]["parameter_type"] == "Parameter"
    assert main["local_shard_rows"] == main["full_rows"] // 2  # each process holds half of each parameter
    # Each layout sums each step's TOKENS_PER_STEP gradient terms in its own order (2 halves, then the reduction):
    # the weights may differ by that rounding, scaled by how far training moved them (tests/tolerances.py).
    bound = reordered_sum_bound(fsdp_workers.TOKENS_PER_STEP, main["moved"])
    assert main["fsdp"]["diff"] <= bound and main["ddp"]["diff"] <= bound, (main["fsdp"], main["ddp"], bound)
    assert results[1]["fsdp"]["diff"] is None  # the whole weights are gathered onto rank 0 only


def test_fsdp_options_train_the_same(fsdp):
    """FSDP with named blocks and no reshard after forward trains the same."""
    main = fsdp[0][0]
    options = main["fsdp_options"]
    assert options["units"] == ["FSDPBlock", "FSDPBlock", "FSDPGPT"]  # each Block, then the model itself
    bound = reordered_sum_bound(fsdp_workers.TOKENS_PER_STEP, main["moved"])  # as for the plain layout above
    assert options["diff"] <= bound, (options["diff"], bound)


def test_late_optimizer_follows_the_shards(fsdp):
    """An optimizer prepared after its model follows the shards; one that already stepped is refused."""
    following = fsdp[0][0]["following"]
    assert following["follows"] is True and following["untouched"] is True
    assert following["refused"] == ("Accelerator.prepare(): this optimizer already stepped on parameters that "
                                    "preparing the model replaced (FSDP shards them; an XLA device gets new ones): "
                                    "prepare it with the model, before training")


def test_fsdp_clip_and_accumulate_match_one_process(fsdp):
    main = fsdp[0][0]
    clipped = main["fsdp_clip_accumulate"]
    assert clipped["norms"] == fsdp_workers.STEPS  # clipped once per optimizer step, not per micro-batch
    # The global norm, over every shard: its gradients carry the relative rounding of TOKENS_PER_STEP reordered
    # terms; squaring and summing positive terms per shard cancels nothing, so the norm keeps that relative size.
    # The weights: as without clipping (the clip factor carries the norm's relative rounding, well inside it).
    terms = fsdp_workers.TOKENS_PER_STEP
    norm_bound = reordered_sum_bound(terms, clipped["largest_norm"])
    weight_bound = reordered_sum_bound(terms, main["clipped_moved"])
    assert clipped["norm_diff"] <= norm_bound, (clipped["norm_diff"], norm_bound)
    assert clipped["diff"] <= weight_bound, (clipped["diff"], weight_bound)


def test_fsdp_evaluation_gives_one_process_metrics(fsdp):
    """Evaluation with fewer rows than processes, or uneven shards, gives one process's metrics."""
    from runner.training.loop import evaluate
    from runner.training.tasks import LanguageModeling

    for rows in (1, 3):  # 1: process 1 has no rows at all (it crashed, or hung FSDP's peers, before)
        alone = evaluate(Accelerator("cpu"), fsdp_workers.tiny_gpt(), fsdp_workers.evaluation_batches(rows),
                         LanguageModeling())
        for rank in (0, 1):
            for kind, metrics in fsdp[0][rank]["evaluation"][f"rows{rows}"].items():
                assert metrics.keys() == alone.keys(), (rows, kind)
                # Means over rows x 8 tokens, summed per process and then across them: one reordered sum.
                assert all(abs(metrics[name] - alone[name]) <= reordered_sum_bound(rows * 8, abs(alone[name]))
                           for name in alone), (rows, kind, metrics, alone)


def test_fsdp_bf16_keeps_fp32_shards_and_grads(fsdp):
    """bf16 under FSDP computes in bf16 and keeps fp32 shards and gradients."""
    policy = fsdp[0][0]["bf16"]
    assert policy["compute"] == "torch.bfloat16" and policy["shards"] == "torch.float32"
    assert policy["grads"] == ["torch.float32"]
    assert policy["diff"] < 0.1 * policy["moved"]  # within 10% of how far training moved the weights


def test_sharded_save_state_resumes_on_any_count(fsdp):
    """Sharded save_state continues bitwise and loads on another process count."""
    results, tmp_dir = fsdp
    assert results[0]["continued_bitwise"] is True
    assert results[0]["one_to_two"] == 0.0  # saved by one process, loaded by two: the same weights
    files = sorted(path.name for path in (tmp_dir / "two").iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "manifest.json", "state.pt"]
    # two -> one: a single process loads the shards of both into a plain model
    accelerator = Accelerator("cpu", parallel="fsdp")
    model, _, _ = fsdp_workers.train(accelerator, fsdp_workers.tiny_gpt(seed=9), steps=0)
    accelerator.load_state(tmp_dir / "two")
    expected = torch.load(tmp_dir / "two_weights.pt", weights_only=True)
    assert fsdp_workers.max_difference(model.state_dict(), expected) == 0.0


def test_fsdp_save_model_writes_the_whole_model(fsdp):
    """save_model under FSDP writes the whole trained model in shards that from_pretrained reads."""
    from huggingface_hub import load_torch_model

    results, tmp_dir = fsdp
    names = results[0]["saved"].split(",")
    assert results[1]["saved"] == results[0]["saved"]  # rank 1 returns after rank 0 wrote: it sees the files
    assert "model.safetensors.index.json" in names and len(names) > 2 and "model.safetensors" not in names
    model = fsdp_workers.tiny_gpt(seed=9)
    load_torch_model(model, tmp_dir / "saved", strict=True)  # transformers' sharded layout, every key present
    expected, _ = fsdp_workers.reference(make_optimizer=fsdp_workers.sgd_momentum)
    bound = reordered_sum_bound(fsdp_workers.TOKENS_PER_STEP, results[0]["moved"])  # trained as in equivalence()
    assert fsdp_workers.max_difference(model.state_dict(), expected) <= bound


def test_checkpointed_compiled_blocks_train_as_plain(fsdp):
    """Checkpointed and compiled blocks train like plain ones and keep their names."""
    blocks = fsdp[0][0]["blocks"]
    assert blocks["checkpointed"] == blocks["plain"]  # recomputing activations changes no number
    assert blocks["compiled"] == pytest.approx(blocks["plain"], rel=1e-5)
    assert blocks["wrapped"] == "FSDPOptimizedModule"  # each block compiled, then sharded
    assert "blocks.0.attn.qkv.weight" in blocks["compiled_names"]
    assert not any("_orig_mod" in name for name in blocks["compiled_names"])


def test_plan_figures_match_each_fsdp_process(fsdp):
    """The plan's figures are what each FSDP process really holds."""
    real = fsdp[0][0]["memory"]
    assert real["whole_parameter_freed"] is True  # else every process keeps the unsharded model too
    with torch.device("meta"):
        model = GPT(vocab_size=17, block_size=8, n_layer=3, n_head=2, n_embd=32, dropout=0.0)
    plan = memory_plan(model, torch.optim.AdamW(model.parameters(), lr=fsdp_workers.LR),
                       ParallelConfig(kind=ParallelKind.fsdp), 2, PrecisionKind.fp32)
    assert (plan.weight_bytes, plan.gradient_bytes, plan.optimizer_bytes) == (
        real["weights"], real["gradients"], real["optimizer"])
    with torch.device("meta"):
        whole = memory_plan(model, torch.optim.AdamW(model.parameters()), ParallelConfig(), 1, PrecisionKind.fp32)
    assert plan.weight_bytes < 0.51 * whole.weight_bytes  # half, and the 17 embedding rows split 9 + 8


# -- blocks, in one process ----------------------------------------------------------------------------------


def test_find_blocks_takes_module_lists_or_names():
    """The blocks are each element of a module list, or the named classes."""
    gpt = GPT(vocab_size=16, block_size=8, n_layer=3, n_head=2, n_embd=16)
    assert [name for _, name, _ in find_blocks(gpt, None, "k")] == ["0", "1", "2"]
    encoder = SeqTransformer(vocab_size=10, max_len=12)
    assert [type(block).__name__ for _, _, block in find_blocks(encoder, None, "k")] == ["TransformerEncoderLayer"] * 2
    named = find_blocks(gpt, ["CausalSelfAttention"], "k")
    assert [parent is block_parent for (parent, _, _), block_parent in zip(named, gpt.blocks)] == [True] * 3
    with pytest.raises(ConfigError, match=r"parallel.shard_modules: names Nope, which the model has no module of; "
                                          r"name the block classes to use, e.g. parallel.shard_modules=\[Block\]"):
        find_blocks(gpt, ["Nope"], "parallel.shard_modules")
    with pytest.raises(ConfigError, match="activation_checkpointing.modules: is null .* has no nn.ModuleList"):
        checkpoint_blocks(MLP(4, 2, hidden=[8]), None)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def _allocated_mib() -> float:
    """Bytes in use in glibc's allocator, where torch's CPU tensors live (RSS would also count what the allocator
    freed but kept: measured, it hides the saving)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20


def test_activation_checkpointing_saves_memory():
    """Activation checkpointing gives the same gradients with less memory."""
    plain = GPT(16, 8, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    checkpointed = GPT(16, 8, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    checkpointed.load_state_dict(plain.state_dict())
    assert checkpoint_blocks(checkpointed, ["Block"]) == 2
    tokens = fsdp_workers.global_batch(0)
    for model in (plain, checkpointed):
        fsdp_workers.loss_of(model, tokens).backward()
    for (name, a), (other, b) in zip(plain.named_parameters(), checkpointed.named_parameters()):
        assert other.replace("_checkpoint_wrapped_module.", "") == name and torch.equal(a.grad, b.grad), name
    assert list(checkpointed.state_dict()) == list(plain.state_dict())  # checkpoints keep the model's names

    try:
        _allocated_mib()
    except (OSError, AttributeError):
        pytest.skip("the allocator's figures are read from glibc's mallinfo2")
    held, peaks = zip(*(_activation_memory(checkpointing) for checkpointing in (False, True)))
    # Measured: 135 MiB held after forward without, 11 MiB with (8 blocks, 32 x 64 tokens x 128 features).
    assert held[1] < 0.3 * held[0], held
    assert peaks[1] < 0.5 * peaks[0], peaks


def _activation_memory(checkpointing: bool) -> tuple[float, float]:
    """MiB the autograd graph holds after forward, and the most in use while backward goes through the blocks."""
    torch.manual_seed(0)
    model = GPT(vocab_size=64, block_size=64, n_layer=8, n_head=4, n_embd=128)  # activations >> weights
    if checkpointing:
        checkpoint_blocks(model, None)
    peak = [0.0]
    for block in model.blocks:  # sampled as backward reaches each block, where recomputation happens
        block.register_full_backward_hook(lambda *_: peak.__setitem__(0, max(peak[0], _allocated_mib())))
    tokens = torch.randint(0, 64, (32, 64), generator=torch.Generator().manual_seed(0))
    before = _allocated_mib()
    loss = fsdp_workers.loss_of(model, tokens)
    held = _allocated_mib() - before
    loss.backward()
    return held, peak[0] - before


def test_compile_gives_the_eager_loss_and_names():
    """torch.compile gives the eager loss and keeps the module and its names."""
    eager = GPT(16, 8, n_layer=2, n_head=2, n_embd=32)
    compiled = GPT(16, 8, n_layer=2, n_head=2, n_embd=32)
    compiled.load_state_dict(eager.state_dict())
    same = prepare_blocks(compiled, ActivationCheckpointingConfig(), CompileConfig(enabled=True, backend="aot_eager"),
                          ParallelConfig(), sharded=False)
    assert same is compiled and Accelerator("cpu").unwrap_model(compiled) is compiled
    tokens = fsdp_workers.global_batch(1)
    losses = [float(fsdp_workers.loss_of(model, tokens)) for model in (eager, compiled)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    assert list(compiled.state_dict()) == list(eager.state_dict())  # no `_orig_mod.` in what checkpoints save
    assert compiled._compiled_call_impl is not None


def test_inductor_compiles_in_place_to_eager_results():
    """Inductor compiles the model in place to the eager loss and gradients."""
    from runner.accelerate.parallel import cxx_compiler

    if cxx_compiler() is None:
        pytest.skip("torch.compile's default backend (inductor) needs a C++ compiler on a CPU and none was found; "
                    "the aot_eager tests above still cover the capture (runner's check refuses the run with the fix)")
    eager = MLP(4, 2, hidden=[8])
    compiled = MLP(4, 2, hidden=[8])
    compiled.load_state_dict(eager.state_dict())
    compile_model(compiled, CompileConfig(enabled=True), None, sharded=False)  # inductor: generated C++ kernels
    assert Accelerator("cpu").unwrap_model(compiled) is compiled
    features, labels = torch.randn(16, 4), torch.randint(0, 2, (16,))
    losses = []
    for model in (eager, compiled):
        loss = nn.functional.cross_entropy(model(features), labels)
        loss.backward()
        losses.append(float(loss.detach()))
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    for (name, a), (other, b) in zip(eager.named_parameters(), compiled.named_parameters()):
        assert name == other and torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7), name
    assert list(compiled.state_dict()) == list(eager.state_dict())  # no `_orig_mod.` in what checkpoints save


def test_compile_in_place_captures_a_torch_nn_model():
    calls = []

    def counting_backend(graph, inputs):
        calls.append(len(graph.graph.nodes))
        return graph.forward

    model = MLP(4, 2, hidden=[8])  # an nn.Sequential: torch.nn's own forward
    compile_model(model, CompileConfig(enabled=True, backend=counting_backend), None, sharded=False)
    model(torch.randn(3, 4))
    assert calls and calls[0] > 3


# -- what the checks refuse ------------------------------------------------------------------------------------


def test_fsdp_fp16_offload_and_no_cxx_are_refused(monkeypatch):
    """FSDP refuses fp16 and cpu_offload on a CPU; compile refuses a missing C++ compiler."""
    spec = load(["parallel=fsdp", "hardware=multi_cpu", "precision=bf16"])
    assert spec.config.parallel.kind.value == "fsdp"  # bf16 with fsdp is fine
    with pytest.raises(ConfigError) as refused:
        load(["parallel=fsdp", "hardware=multi_cpu", "precision=fp16", "parallel.cpu_offload=true"])
    text = str(refused.value)
    assert "precision: is fp16, which parallel=fsdp does not support; use precision=bf16" in text
    assert "parallel.cpu_offload: moves the shards from the GPUs to CPU memory, and this run is on cpu" in text

    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "cxx", ("no-such-c++-compiler",))
    spec = load(["compile.enabled=true", "compile.backend=aot_eager"])  # no C++ needed: accepted
    with pytest.raises(ConfigError, match="compile.backend: is inductor, which on a CPU compiles C.. kernels, and "
                                          "no C.. compiler was found"):
        check(replace(spec.config, compile=CompileConfig(enabled=True)), spec.hardware)
    with pytest.raises(ConfigError, match="compile.mode: is 'fast'; use one of default, "):
        load(["compile.enabled=true", "compile.backend=aot_eager", "compile.mode=fast"])


def test_accelerator_takes_parallel_by_name():
    assert Accelerator("cpu", parallel="fsdp").parallel.kind.value == "fsdp"
    assert not Accelerator("cpu", parallel="fsdp").shards_parameters  # one process: nothing to shard
    with pytest.raises(ConfigError, match="parallel: is 'zero3'; use one of ddp, fsdp, none"):
        Accelerator("cpu", parallel="zero3")
    model = nn.Linear(2, 2)
    assert Accelerator("cpu", parallel="fsdp").prepare(model) is model
