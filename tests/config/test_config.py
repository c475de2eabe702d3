"""Composition: the schema, the defaults list, recipes and overrides, and the frozen user-facing surface."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from runner.run.compose import CONFIG_DIR, freeze
from runner.config import HardwareKind, PrecisionKind, RunConfig, plain
from runner.run.resolvers import register_configs

register_configs()


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_default_composes_to_the_reverse_recipe():
    config = freeze(_compose(), Path("/tmp/run")).config
    assert isinstance(config, RunConfig)
    assert config.hardware.kind is HardwareKind.cpu and config.precision.kind is PrecisionKind.fp32
    assert config.model["_target_"] == "runner.models.SeqTransformer"
    assert config.model["max_len"] == config.data["seq_len"] == 12  # interpolation resolved at freeze time
    assert config.optimizer == {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 3e-3, "weight_decay": 0.01,
                                "param_groups": {"no_decay": {"select": ["biases", "norms"], "weight_decay": 0.0}}}
    assert config.scheduler["_target_"] == "runner.schedules.warmup_cosine"


def test_precedence_is_schema_group_recipe_cli():
    """Each later source wins: the schema's default, then the group, then the recipe, then the command line."""
    config = freeze(_compose("recipe=digits_mlp", "optimizer=sgd", "optimizer.lr=0.05", "seed=7"), Path("/r")).config
    assert config.optimizer["_target_"] == "torch.optim.SGD"  # the command line picks the group
    assert config.optimizer["lr"] == 0.05  # and its values win over the recipe's lr
    assert config.optimizer["momentum"] == 0.9  # the group's value
    assert config.model["hidden"] == [512] and config.model["dropout"] == 0.3  # the recipe's over the group's [128], 0
    assert config.scheduler is None and config.seed == 7
    assert config.trainer.grad_accum_steps is None  # untouched: the schema default (derived from the batch)


def test_frozen_spec_holds_plain_containers_only():
    spec = freeze(_compose("recipe=digits_mlp"), Path("/tmp/run"))
    assert plain(spec.config)["precision"]["kind"] == "fp32"  # enums as strings: safe to dump and to log
    assert type(spec.config.model) is dict and type(spec.config.model["hidden"]) is list
    assert spec.run_dir == "/tmp/run"


def test_hydra_run_dir_is_unique_under_outputs():
    """One run dir per start, under outputs/ (a sweep's under outputs/multirun/)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        hydra_cfg = compose("config", return_hydra_config=True).hydra
    assert hydra_cfg.run.dir.startswith("outputs/") and hydra_cfg.sweep.dir.startswith("outputs/multirun/")
    assert hydra_cfg.job.name == "runner" and hydra_cfg.job.chdir is False


# The user-facing surface, frozen on purpose: a new knob or option must change this test in a reviewed diff.
EXPECTED_GROUPS = {
    "hardware": ["auto", "cpu", "gpu", "multi_cpu", "multi_gpu", "tpu"],
    "parallel": ["ddp", "fsdp", "none"],
    "precision": ["bf16", "fp16", "fp32", "fp8"],
    "model": ["bag_of_ngrams", "gpt", "hf_causal_lm", "hf_pretrained", "mlp", "resnet", "seq_transformer",
              "text_classifier"],
    "optimizer": ["adamw", "adamw_transformer", "sgd"],
    "scheduler": ["none", "warmup_cosine"],
    "data": ["digits_images", "hub", "image_folder", "image_parquet", "local_files", "reverse_digits", "sklearn_digits",
             "text_classification", "text_files"],
    "tokenizer": ["bpe", "char", "pretrained"],
    "task": ["classification", "hf_causal_lm", "hf_classification", "language_model", "seq2seq"],
    "recipe": ["digits_cnn", "digits_mlp", "gpt", "gpt2_hf", "image_folder", "reverse", "tabular_csv",
               "text_classification"],
    "hparams_search": ["lr_width"],
    "logger": ["csv", "mlflow", "tensorboard", "wandb"],
    "callbacks": ["early_stopping", "ema", "lr_monitor", "profiler", "throughput"],
    "debug": ["fast"],
    "hydra/launcher": ["parallel", "slurm", "slurm_local"],
    "local": [],  # git-ignored per-machine files
}


def test_config_groups_are_frozen():
    root = Path(CONFIG_DIR)
    # conf/recipe is a link to the top-level recipes/ folder, which rglob does not follow.
    group_dirs = {str(p.parent.relative_to(root)) for p in root.rglob("*.yaml") if p.parent != root} | {"local", "recipe"}
    assert sorted(group_dirs) == sorted(EXPECTED_GROUPS)
    groups = {group: sorted(p.stem for p in (root / group).glob("*.yaml")) for group in EXPECTED_GROUPS}
    assert groups == EXPECTED_GROUPS


def test_schema_keys_are_frozen():
    assert sorted(OmegaConf.to_container(OmegaConf.structured(RunConfig)).keys()) == sorted(
        ["hardware", "parallel", "precision", "activation_checkpointing", "compile", "model", "optimizer", "scheduler",
         "data", "task", "seed", "gpu_ids", "trainer", "checkpoint", "logging", "logger", "callbacks", "resume",
         "allowed_targets"]
    )
    structured = OmegaConf.structured(RunConfig)
    assert sorted(structured.trainer.keys()) == sorted(
        ["max_epochs", "max_steps", "batch_size", "eval_batch_size", "eval_every_steps", "log_every_steps",
         "grad_accum_steps", "max_grad_norm", "monitor", "monitor_mode", "progress_bar", "progress_every_s",
         "data_in_memory_mb", "on_nonfinite", "micro_batch_size", "per_device_batch_size", "limit_train_batches",
         "limit_val_batches", "overfit_batches", "fast_dev_run", "deterministic"]
    )
    assert sorted(structured.parallel.keys()) == sorted(
        ["kind", "find_unused_parameters", "static_graph", "gradient_as_bucket_view", "bucket_cap_mb",
         "broadcast_buffers", "shard_modules", "reshard_after_forward", "cpu_offload"]
    )
    assert sorted(structured.activation_checkpointing.keys()) == ["enabled", "modules"]
    assert sorted(structured.compile.keys()) == ["backend", "enabled", "fullgraph", "mode"]
    assert sorted(structured.hardware.keys()) == sorted(
        ["kind", "num_processes", "threads_per_process", "start_method", "num_machines", "machine_rank",
         "main_process_ip", "main_process_port", "timeout_s", "shutdown_timeout_s", "max_restarts", "launcher",
         "ray_address"]
    )
    assert sorted(structured.precision.keys()) == ["fp8_emulation", "kind"]
    assert sorted(structured.checkpoint.keys()) == sorted(
        ["enabled", "dir", "every_epoch", "every_n_steps", "keep_last", "keep_best", "verify", "export", "init_from",
         "stop_signals"]
    )
    assert sorted(structured.logging.keys()) == ["jsonl", "name", "notes", "tags"]


def test_list_group_entries_take_overrides():
    """logger and callbacks are list groups (logger=[tensorboard,csv]) whose entries take overrides."""
    config = freeze(_compose(), Path("/tmp/run")).config
    assert config.logger == {"tensorboard": {"_target_": "runner.loggers.TensorBoardSink", "_partial_": True}}
    assert config.callbacks == {}
    config = freeze(_compose("logger=[tensorboard,csv]", "callbacks=[early_stopping,ema]",
                             "callbacks.early_stopping.patience=5"), Path("/tmp/run")).config
    assert list(config.logger) == ["tensorboard", "csv"] and list(config.callbacks) == ["early_stopping", "ema"]
    assert config.callbacks["early_stopping"]["patience"] == 5
    assert freeze(_compose("logger=[]"), Path("/tmp/run")).config.logger == {}


@pytest.mark.parametrize("recipe", EXPECTED_GROUPS["recipe"])
def test_every_recipe_documents_itself(recipe):
    text = (Path(CONFIG_DIR) / "recipe" / f"{recipe}.yaml").read_text()
    assert text.startswith("# @package _global_\n# ")  # a comment saying what the experiment is
    assert "defaults:" in text and "override /model:" in text and "override /data:" in text


def _compose_as_a_run(*overrides: str):
    """Composed as `python -m runner` composes it: a group swapped on the command line drops the recipe's keys."""
    from runner.run.compose import apply_group_swaps

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return apply_group_swaps(compose("config", overrides=list(overrides), return_hydra_config=True))


def test_scheduler_none_logs_the_dropped_keys(caplog):
    """scheduler=none on the default recipe is a constant rate, and the log names the recipe's dropped keys."""
    from runner.run.checks import check
    from runner.distributed.devices import resolve_hardware

    with caplog.at_level(logging.INFO, logger="runner"):
        config = freeze(_compose_as_a_run("scheduler=none"), Path("/tmp/run")).config
    assert config.scheduler is None  # no leftover scheduler.warmup_steps on a null node
    assert ("scheduler=none on the command line replaces the warmup_cosine of recipe reverse: its "
            "scheduler.warmup_steps (written for warmup_cosine) is dropped") in caplog.text
    check(config, resolve_hardware(config.hardware, config.gpu_ids))  # what refused it before: no _target_
    assert config.optimizer["lr"] == 3e-3  # other groups keep the recipe's values


def test_swapped_model_drops_the_recipes_model_keys(caplog):
    """The new model group's own keys stay; the log names the dropped ones."""
    with caplog.at_level(logging.INFO, logger="runner"):
        model = freeze(_compose_as_a_run("model=mlp"), Path("/r")).config.model
    assert model["_target_"] == "runner.models.MLP" and "vocab_size" not in model and "max_len" not in model
    assert "its model.vocab_size, model.max_len (written for seq_transformer) are dropped" in caplog.text
    # digits_mlp sets model.hidden for its MLP; the transformer gets none of it.
    model = freeze(_compose_as_a_run("recipe=digits_mlp", "model=seq_transformer"), Path("/r")).config.model
    assert "hidden" not in model and model["d_model"] == 64


def test_swapped_group_takes_its_own_values(caplog):
    """optimizer=sgd takes sgd.yaml's values, not the recipe's, and keeps what the command line sets."""
    with caplog.at_level(logging.INFO, logger="runner"):
        sgd = freeze(_compose_as_a_run("recipe=digits_mlp", "optimizer=sgd"), Path("/r")).config.optimizer
        chosen = freeze(_compose_as_a_run("recipe=digits_mlp", "optimizer=sgd", "optimizer.lr=0.05"),
                        Path("/r")).config.optimizer
    assert sgd["lr"] == 0.1  # conf/optimizer/sgd.yaml's, not the 3e-3 the recipe chose for AdamW
    assert chosen["lr"] == 0.05 and chosen["momentum"] == 0.9
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="runner"):
        same = freeze(_compose_as_a_run("scheduler=warmup_cosine"), Path("/r")).config.scheduler
    assert same["warmup_steps"] == 100 and "dropped" not in caplog.text  # the recipe's own choice: nothing swapped


USER_MODEL = "from torch import nn\n\n\nclass Wide(nn.Module):\n    def __init__(self, width):\n        super().__init__()\n" \
             "        self.layer = nn.Linear(width, width)\n"
USER_RECIPE = "# @package _global_\n{defaults}model:\n  _target_: mylab.Wide\n  width: 8\n" \
              "allowed_targets: [runner., torch., datasets., mylab.]\n"


def test_user_model_told_where_a_key_comes_from(tmp_path, monkeypatch, capsys):
    """A user's model under the default model group is told where a stray key comes from, and the fix."""
    from runner.commands.cli import main

    (tmp_path / "mylab").mkdir()
    (tmp_path / "mylab" / "__init__.py").write_text(USER_MODEL)
    (tmp_path / "myconf" / "recipe").mkdir(parents=True)
    (tmp_path / "myconf" / "recipe" / "wide.yaml").write_text(USER_RECIPE.format(defaults=""))
    fixed = USER_RECIPE.format(defaults="defaults:\n  - override /model: null\n")
    (tmp_path / "myconf" / "recipe" / "wide_fixed.yaml").write_text(fixed)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        main(["-cd", "myconf", "recipe=wide", "trainer.progress_bar=false"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and "Traceback" not in err
    assert "model.vocab_size: is not an argument of mylab.Wide; it takes width." in err
    assert "model.vocab_size comes from " in err and "model/seq_transformer.yaml, the model group's option" in err
    assert "add `- override /model: null` to the defaults list of recipe wide (or add ~model" in err
    # The one-line fix, as the message gives it, leaves only the recipe's keys under model.
    main(["-cd", "myconf", "recipe=wide_fixed", "--cfg", "job"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"] == {"_target_": "mylab.Wide", "width": 8}


def test_a_group_swapped_on_a_users_recipe_drops_its_keys(tmp_path, monkeypatch, caplog):
    """A recipe in ./recipes/ (the README's form, with `override /model: null`) and model=mlp on the command line:
    the recipe's own model keys go, as for a built-in recipe. They were kept (the user's folder is a recipes://
    source, not a file:// one), so the MLP group was built with the user's _target_."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "wide.yaml").write_text(
        USER_RECIPE.format(defaults="defaults:\n  - override /model: null\n"))
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="runner"):
        model = freeze(_compose_as_a_run("recipe=wide", "model=mlp"), Path("/r")).config.model
    assert model["_target_"] == "runner.models.MLP" and "width" not in model
    assert ("model=mlp on the command line replaces recipe wide's own model: its model._target_, model.width are "
            "dropped") in caplog.text
