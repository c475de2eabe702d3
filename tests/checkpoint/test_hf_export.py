"""`export/hf/` (runner/checkpoint/hf_export.py): a transformers model trained by the real CLI loads back with
`transformers.AutoModelForCausalLM.from_pretrained` and is the runner's final model, weight for weight and logit for
logit. Offline: the model is built from its config (recipes/gpt2_hf.yaml), nothing comes from the Hub."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from conftest import read_scalars
from matrix_data import corpus
from tolerances import reordered_sum_bound

TINY_GPT2 = ("model.config.n_layer=1", "model.config.n_head=2", "model.config.n_embd=32", "data.block_size=16")


def test_gpt2_hf_export_loads_with_final_weights(cli, tmp_path):
    """A gpt2_hf run exports a model that from_pretrained loads with the final weights."""
    transformers = pytest.importorskip("transformers")
    from runner.data import make_batches, text_files
    from runner.data.tokenizers import CharLevel
    from runner.training.hf_tasks import HuggingFaceCausalLM
    from runner.commands.sample import load_model

    text = tmp_path / "text.txt"
    text.write_text(corpus(300))
    result = cli("recipe=gpt2_hf", f"data.train={text}", *TINY_GPT2, "trainer.max_steps=3",
                 "trainer.eval_batch_size=64", "trainer.progress_bar=false")
    assert result.returncode == 0, result.output
    run_dir = result.run_dir()
    export = run_dir / "export" / "hf"
    assert {"config.json", "model.safetensors"} <= {path.name for path in export.iterdir()}
    assert not (run_dir / "export" / ".hf.partial").exists()

    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(export)).eval()
    assert isinstance(loaded, transformers.GPT2LMHeadModel)
    assert (loaded.config.n_layer, loaded.config.n_embd, loaded.config.n_positions) == (1, 32, 16)
    # The runner's own final weights, rebuilt the way runner.commands.sample does: the same model as the HF export.
    final = load_model(run_dir / "export" / "final.safetensors", run_dir / "export" / "config.yaml")
    last_checkpoint = load_file(run_dir / "checkpoints" / "step_00000003" / "model.safetensors")
    exported = loaded.state_dict()
    for name, value in final.state_dict().items():
        assert torch.equal(exported[name], value), name
        if name in last_checkpoint:  # the tied lm_head is stored once, as the embedding
            assert torch.equal(last_checkpoint[name], value), name
    ids = torch.randint(0, loaded.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, final(ids).logits)

    # And it is the model the run evaluated last: its loss on the validation text is the logged val/loss.
    splits = text_files(str(text), CharLevel(), block_size=16)
    task = HuggingFaceCausalLM()
    with torch.no_grad():
        parts = [task.evaluation_stats(loaded, batch) for batch in make_batches(splits["validation"], 64, False, 0, 64)]
    val_loss = task.summarize({key: sum(part[key] for part in parts) for key in parts[0]})["loss"]
    (step, logged), = read_scalars(run_dir, "val/loss")
    # A mean over every validation token, which this process may sum in another order (other threads, batches).
    tokens = len(splits["validation"]) * 16
    assert step == 3 and abs(val_loss - logged) <= reordered_sum_bound(tokens, abs(logged)), (val_loss, logged)
