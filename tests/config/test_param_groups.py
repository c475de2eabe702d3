"""optimizer.param_groups (runner/config/param_groups.py): named parameter groups with options of their own, and the
transformer recipes' AdamW that leaves biases and norm weights out of weight decay."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from runner.config.instantiate import build_optimizer
from runner.errors import ConfigError
from runner.models import GPT

NO_DECAY = {"no_decay": {"select": ["biases", "norms"], "weight_decay": 0.0}}


def _adamw(groups=None, **options) -> dict:
    return {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.1, "weight_decay": 0.5, **options,
            **({"param_groups": groups} if groups is not None else {})}


def _ids(parameters) -> set[int]:
    return {id(parameter) for parameter in parameters}


def test_biases_and_norms_get_no_weight_decay():
    """With biases and LayerNorms (bias=True), the no-decay group is nanoGPT's rule exactly: every tensor of fewer
    than 2 dimensions. The tied head/embedding matrix is one tensor, decayed."""
    model = GPT(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, bias=True)
    optimizer = build_optimizer(_adamw(NO_DECAY), model)
    others, no_decay = optimizer.param_groups
    assert (others["weight_decay"], no_decay["weight_decay"]) == (0.5, 0.0)
    assert _ids(no_decay["params"]) == _ids(p for p in model.parameters() if p.dim() < 2)
    assert _ids(others["params"]) == _ids(p for p in model.parameters() if p.dim() >= 2)
    assert id(model.head.weight) in _ids(others["params"]) and len(others["params"]) + len(no_decay["params"]) == \
        len(list(model.parameters()))


def test_a_step_decays_only_the_other_group():
    """Zero gradients: AdamW's update is the decoupled decay alone, p <- p * (1 - lr * weight_decay)."""
    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    optimizer = build_optimizer(_adamw(NO_DECAY), model)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    after = dict(model.named_parameters())
    torch.testing.assert_close(after["0.weight"], before["0.weight"] * (1 - 0.1 * 0.5), rtol=0, atol=1e-7)
    for name in ("0.bias", "1.weight", "1.bias"):
        assert torch.equal(after[name], before[name]), name


def test_pattern_selects_by_name_first_group_wins(caplog):
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    groups = {"head": {"select": ["1.*"], "lr": 0.01}, "biases": {"select": ["biases"], "weight_decay": 0.0}}
    with caplog.at_level("INFO", logger="runner.config.instantiate"):
        optimizer = build_optimizer(_adamw(groups), model)
    assert caplog.messages == ["AdamW parameter groups: others 1 tensors (9 values); head 2 tensors (8 values), "
                               "lr=0.01; biases 1 tensors (3 values), weight_decay=0.0"]
    others, head, biases = optimizer.param_groups
    assert _ids(others["params"]) == {id(model[0].weight)}
    assert _ids(head["params"]) == {id(model[1].weight), id(model[1].bias)} and head["lr"] == 0.01
    assert _ids(biases["params"]) == {id(model[0].bias)} and biases["lr"] == 0.1


def test_biases_on_a_bias_free_model_is_no_error():
    model = GPT(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, bias=False)
    _, no_decay = build_optimizer(_adamw(NO_DECAY), model).param_groups
    assert _ids(no_decay["params"]) == _ids([model.blocks[0].ln_1.weight, model.blocks[0].ln_2.weight,
                                             model.ln_f.weight])


@pytest.mark.parametrize("groups, key, words", [
    ({"g": {"select": ["head.*"]}}, "optimizer.param_groups.g.select",
     "'head.*' selects no parameter of Sequential; use biases or norms, or a pattern on its names (e.g. 0.weight"),
    ({"g": {"weight_decay": 0.0}}, "optimizer.param_groups.g.select", "is not set"),
    ({"g": {"select": ["biases"], "weight_decy": 0.0}}, "optimizer.param_groups.g.weight_decy",
     "is not an option of AdamW; its options are "),
    ({"a": {"select": ["biases"]}, "b": {"select": ["*.bias"]}}, "optimizer.param_groups.b.select",
     "that an earlier group does not already hold"),
    (["biases"], "optimizer.param_groups", "it must map group names"),
])
def test_a_bad_group_names_its_key(groups, key, words):
    with pytest.raises(ConfigError) as err:
        build_optimizer(_adamw(groups), nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3)))
    (problem,) = err.value.problems
    assert problem.key == key and words in problem.message, str(err.value)


@pytest.mark.parametrize("recipe", ["gpt", "gpt2_hf", "reverse", "text_classification"])
def test_transformer_recipes_exempt_biases_and_norms(recipe):
    """The transformer recipes exempt biases and norms from weight decay (NO_DECAY)."""
    from omegaconf import OmegaConf

    from runner.run.compose import compose_config

    overrides = [f"recipe={recipe}"] + (["data.train=x.txt"] if recipe != "reverse" else [])
    optimizer = OmegaConf.to_container(compose_config(overrides).optimizer)
    assert optimizer["param_groups"] == NO_DECAY and optimizer["_target_"] == "torch.optim.AdamW"


def test_no_bias_or_norm_leaves_one_group():
    """A model with no bias or norm gets no no-decay group: one group, decayed."""
    model = nn.Linear(3, 3, bias=False)
    (only,) = build_optimizer(_adamw(NO_DECAY), model).param_groups
    assert only["params"] == [model.weight] and only["weight_decay"] == 0.5
