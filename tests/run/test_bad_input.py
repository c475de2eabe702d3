"""Bad input, catalogued: each case ends in one `runner: error:` paragraph that names the key to change, exit code 1,
no traceback, and every file that was there before is byte-identical and nothing is left behind.

The cases run `runner.commands.cli.main` in this process (composition, checks and building fail in well under a second
each); a few run the real command in a subprocess for the exit code and the console as a user sees them.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY, WAIT_S, run_cli

from runner.commands.cli import main

NOTEBOOK = "analysis.ipynb"  # a user's own file next to where they run the command


def _csv(rows: list[str]) -> str:
    return "\n".join(rows) + "\n"


# Tables the data cases read, written into the working directory before each case (so they are "the user's").
TABLES = {
    "empty.csv": "",
    "empty.txt": "",
    "header.csv": "a,b,label\n",
    "words.csv": _csv(["a,b,label", "1,2,x", "3,red,y", "4,5,x"]),
    "hole.csv": _csv(["a,b,label", "1,2,x", "3,,y", "4,5,x"]),
    "one_class.csv": _csv(["a,b,label", "1,2,x", "3,4,x", "5,6,x"]),
    "six_classes.csv": _csv(["a,b,label"] + [f"{i},{i * 2},{i % 6}" for i in range(36)]),
    "species.csv": _csv(["a,b,species"] + [f"{i},{i * 2},{('setosa', 'versicolor', 'virginica')[i % 3]}"
                                            for i in range(12)]),
    "negative.csv": _csv(["a,b,label"] + [f"{i},{i * 2},{i % 3 - 1}" for i in range(12)]),
    "good.csv": _csv(["a,b,c,d,label"] + [f"{i},{i % 3},{i % 5},{i % 7},{['p', 'q', 'r'][i % 3]}" for i in range(30)]),
    "not_parquet.parquet": _csv(["a,b,label", "1,2,x"]),
    "infinite.csv": _csv(["a,b,label", "1,2,x", "3,inf,y", "4,5,x"]),
    "huge.csv": _csv(["a,b,label", "1,2,x", "1e300,4,y", "4,5,x"]),
    "no_text.csv": _csv(["text,label", "hello world,a", ",b", "foo bar,a", "baz,b"]),
    "numbers_as_text.csv": _csv(["text,label", "5,a", "6,b", "7,a", "8,b"]),
    "no_label.csv": _csv(["text,label", "hello,a", "world,", "foo,a", "bar,b"]),
    "unclosed.csv": _csv(["a,b,c,d,label", '1,2,3,4,"p']),
    "other_columns.csv": _csv(["a,b,c,e,label"] + [f"{i},{i % 3},{i % 5},{i % 7},{['p', 'q', 'r'][i % 3]}"
                                                   for i in range(6)]),
}
NOT_UTF8 = {"latin1.txt": "café au lait\n".encode("latin-1") * 20}  # text in another encoding
TABULAR = ("recipe=tabular_csv",)
BAD_RECIPE = "# @package _global_\ntrainer:\n  max_steps: [1\n"

# (id, command-line arguments, the key (or override) the message must name, a phrase it must contain)
CASES = [
    # Composition: Hydra and the typed schema.
    ("unknown recipe", ["recipe=revers"], "recipe", "'revers' is not one of its options; did you mean reverse?"),
    ("unknown group option", ["precision=fp17"], "precision", "the valid names are bf16, fp16, fp32, fp8"),
    ("misspelled key", ["trainer.max_step=3"], "trainer.max_step", "did you mean trainer.max_steps?"),
    ("setting of a callback not selected", ["callbacks.early_stopping.patience=3"], "callbacks.early_stopping",
     "is an option of callbacks that this run does not select (callbacks holds none); select it with "
     "callbacks=[early_stopping]"),
    ("misspelled argument of a target", ["model.d_modle=3"], "model.d_modle",
     "did you mean model.d_model? To add a key model does not have (an argument of its target), give it with +: "
     "+model.d_modle=3"),
    ("bad enum value", ["hardware.kind=gpus"], "hardware.kind", "cpu, gpu, multi_gpu, multi_cpu, tpu, auto"),
    ("wrong type", ["trainer.max_steps=abc"], "trainer.max_steps", "could not be converted to Integer"),
    ("bad on_nonfinite", ["trainer.on_nonfinite=panic"], "trainer.on_nonfinite", "stop, skip, ignore"),
    ("override that does not parse", ["trainer.batch_size=[1"], "'trainer.batch_size=[1'", "does not parse"),
    ("a sweep without -m", ["optimizer.lr=1e-3,3e-4"], "optimizer.lr", "--multirun"),
    ("interpolation to a missing key", ["optimizer.lr=${nope}"], "optimizer.lr", "'nope' not found"),
    ("required value left unset", [*TABULAR], "data.train", "is required and has no value"),
    ("yaml syntax error in a recipe", ["-cd", "myconf", "recipe=broken"], "broken.yaml", "line 3"),
    ("config dir that does not exist", ["-cd", "no_such_dir"], "--config-dir", "is not a folder"),
    # Cross-field checks.
    ("batch size 0", ["trainer.batch_size=0"], "trainer.batch_size", "is 0; it must be 1 or more"),
    ("no epochs", ["trainer.max_epochs=0"], "trainer.max_epochs", "it must be 1 or more"),
    ("log cadence 0", ["trainer.log_every_steps=0"], "trainer.log_every_steps", "it must be 1 or more"),
    ("progress line cadence below 0", ["trainer.progress_every_s=-5"], "trainer.progress_every_s",
     "is -5.0; it must be 0 (a line every step) or more seconds"),
    ("accumulation 0", ["trainer.grad_accum_steps=0"], "trainer.grad_accum_steps", "it must be 1 or more"),
    ("negative step budget", ["trainer.max_steps=-4"], "trainer.max_steps", "it must be positive"),
    ("negative clipping", ["trainer.max_grad_norm=-1"], "trainer.max_grad_norm", "it must be positive"),
    ("monitor never measured", ["trainer.monitor=val/acc"], "trainer.monitor", "reports val/loss, val/accuracy"),
    ("early stopping on a metric never measured", ["callbacks=[early_stopping]",
                                                   "callbacks.early_stopping.monitor=val/acc"],
     "callbacks.early_stopping.monitor", "'val/acc' is not measured by this run; SequenceToSequence reports val/loss"),
    ("keep_last 0", ["checkpoint.keep_last=0"], "checkpoint.keep_last", "it must be 1 or more"),
    ("keep_best without checkpoints", ["checkpoint.keep_best=2", "checkpoint.enabled=false"], "checkpoint.keep_best",
     "needs checkpoint.enabled=true"),
    ("two processes on hardware=cpu", ["hardware.num_processes=2"], "hardware", "use hardware=multi_cpu"),
    ("no processes", ["hardware=multi_cpu", "hardware.num_processes=0"], "hardware.num_processes", "1 or more"),
    ("machine rank out of range", ["hardware=multi_cpu", "hardware.num_machines=2", "hardware.machine_rank=2",
                                   "hardware.main_process_ip=10.0.0.1", "hardware.main_process_port=29500"],
     "hardware.machine_rank", "0 .. num_machines-1"),
    ("several machines without an address", ["hardware=multi_cpu", "hardware.num_machines=2"],
     "hardware.main_process_ip", "machine 0's address"),
    ("gpu_ids that do not parse", ["gpu_ids=[a]"], "gpu_ids", "list of GPU indices"),
    ("fp8 without a GPU", ["precision=fp8"], "precision.fp8_emulation", "compute capability >= 8.9"),
    ("a GPU run without CUDA", ["hardware=gpu"], "hardware", "gpu needs a CUDA GPU"),
    ("resume from nowhere", ["resume=/no/such/run"], "resume", "neither a checkpoint nor a directory"),
    # A key added with `+` (as Hydra's own error advises) that no setting reads.
    ("a misspelled setting added with +", ["+trainer.max_step=5"], "trainer.max_step",
     "is not a setting of trainer, so nothing would read it; did you mean trainer.max_steps?"),
    ("an unknown top-level key added with +", ["+seed2=3"], "seed2", "did you mean seed?"),
    # Targets.
    ("missing target", ["~model._target_"], "model._target_", "is missing"),
    ("unimportable target", ["model._target_=runner.models.Transformr"], "model._target_", "no attribute 'Transformr'"),
    ("target outside the allow-list", ["model._target_=numpy.load"], "model._target_", "allowed_targets"),
    ("code-running target under an allowed prefix", ["model._target_=torch.utils.collect_env.run"],
     "model._target_", "runs arbitrary code"),
    ("nested target", ["+model.block={_target_: os.system, command: id}"], "model.block._target_", "runs arbitrary"),
    ("torch.load without weights_only", ["+model.block={_target_: torch.load, f: x.pt}"], "model.block._target_",
     "weights_only: true"),
    # A path through another module's namespace is judged by what it resolves to.
    ("torch.load by another path", ["+model.block={_target_: torch.functional.torch.load, f: x.pt}"],
     "model.block._target_", "(that is torch.load) without weights_only: true"),
    ("pickle by another path", ["+model.block={_target_: torch.serialization.pickle.loads, data: x}"],
     "model.block._target_", "(that is pickle) runs arbitrary code"),
    ("importlib by an allowed prefix", ["+model.block={_target_: runner.config.instantiate.importlib.import_module, "
                                        "name: x}"], "model.block._target_", "(that is importlib) runs arbitrary code"),
    ("torch's launcher, which runs a command", ["+model.block={_target_: torch.distributed.run.main, args: [x]}"],
     "model.block._target_", "runs arbitrary code or commands"),
    ("torch.save, which writes over a file", ["+model.block={_target_: torch.save, obj: x, f: x.pt}"],
     "model.block._target_", "runs arbitrary code or commands"),
    ("trust_remote_code", ["+model.block={_target_: torch.nn.Linear, trust_remote_code: true}"],
     "model.block.trust_remote_code", "runs code downloaded"),
    ("hydra callback target", ["+hydra.callbacks.evil._target_=torch.utils.collect_env.run"],
     "hydra.callbacks.evil._target_", "runs arbitrary code"),
    ("a logging handler class outside the allow-list", ["hydra.job_logging.handlers.console.class=sidefx.Handler"],
     "hydra.job_logging.handlers.console.class", "'sidefx.Handler' is not under an allowed module prefix"),
    ("a logging stream that imports a module", ["hydra.hydra_logging.handlers.console.stream=ext://sidefx.stream"],
     "hydra.hydra_logging.handlers.console.stream", "'sidefx.stream' is not under an allowed module prefix"),
    ("a million processes", ["hardware=multi_cpu", "hardware.num_processes=1000000"], "hardware.num_processes",
     "is 1000000, more than 16 per CPU core of this machine"),
    ("a port out of range", ["hardware=multi_cpu", "hardware.num_machines=2", "hardware.main_process_ip=127.0.0.1",
                             "hardware.main_process_port=70000"], "hardware.main_process_port",
     "is 70000; it must be a TCP port, 1 .. 65535"),
    # Sweeps: what every trial would meet, said once before the first.
    ("a launcher that is not a Hydra plugin", ["-m", "hydra.launcher._target_=os.system"], "hydra.launcher._target_",
     "'os.system' is not a Hydra launcher installed here"),
    ("a misspelled swept key", ["-m", "trainer.max_step=1,2"], "trainer.max_step",
     "is swept on the command line, but this config has no such setting; did you mean trainer.max_steps?"),
    ("an interval in a grid", ["-m", "optimizer.lr=interval(1e-4,1e-2)"], "optimizer.lr",
     "a range a grid cannot list"),
    ("a search written for another recipe", ["recipe=gpt", "hparams_search=lr_width"], "model.d_model",
     "is searched by hparams_search=lr_width (its hydra.sweeper.params), but this config has no such setting"),
    ("a sampler the recipe's checks refuse", ["hparams_search=lr_width", "hydra/sweeper/sampler=random",
                                               "hydra.sweeper.sampler._target_=builtins.dict"],
     "hydra.sweeper.sampler._target_", "'builtins.dict' runs arbitrary code or commands"),
    ("a search space function outside the allow-list", ["hparams_search=lr_width",
                                                         "hydra.sweeper.custom_search_space=mylab.space"],
     "hydra.sweeper.custom_search_space", "'mylab.space' is not under an allowed module prefix"),
    # Loggers, callbacks, debug limits.
    ("unknown logger", ["logger=[tensorboard,tensorbord]"], "logger: 'tensorbord' is not one of its options",
     "the valid names are csv, mlflow, tensorboard, wandb"),
    ("unknown callback", ["callbacks=[early_stop]"], "callbacks: 'early_stop'", "early_stopping, ema, lr_monitor"),
    ("callback with a bad target", ["+callbacks.mine._target_=runner.callbacks.Nope"], "callbacks.mine._target_",
     "no attribute 'Nope'"),
    ("callback outside the allow-list", ["+callbacks.mine._target_=mylab.Cb"], "callbacks.mine._target_",
     "allowed_targets"),
    ("bad patience", ["callbacks=[early_stopping]", "callbacks.early_stopping.patience=0"],
     "callbacks.early_stopping.patience", "patience is 0; it must be 1 or more"),
    ("an optional logger not installed", ["logger=[mlflow]"], "logger.mlflow", "pip install 'mlflow>=2.10'"),
    ("limit of no batches", ["trainer.limit_train_batches=0"], "trainer.limit_train_batches", "it must be positive"),
    ("limit below one step's micro-batches", ["trainer.limit_train_batches=2", "trainer.grad_accum_steps=4"],
     "trainer.limit_train_batches", "is 2 micro-batches, fewer than the 4 that one optimizer step accumulates"),
    # Building: the library's refusal, with the key the user set.
    ("unknown constructor argument", ["+model.widht=3"], "model.widht", "is not an argument of runner.models"),
    ("negative learning rate", ["optimizer.lr=-1"], "optimizer.lr", "Invalid learning rate"),
    ("a learning rate given as text", ["optimizer.lr=abc"], "optimizer.lr",
     "is 'abc', text where torch.optim.AdamW takes a number (its default: 0.001)"),
    ("a sequence length given as text", ["data.seq_len=abc"], "data.seq_len", "text where runner.data.digit_sequences"),
    ("negative weight decay", ["optimizer.weight_decay=-0.1"], "optimizer.weight_decay", "Invalid weight_decay"),
    ("heads that do not divide the width", ["model.nhead=5"], "model.nhead", "does not divide model.d_model=64"),
    ("zero-length sequences", ["data.seq_len=0"], "data.seq_len", "is 0; it must be 1 or more"),
    ("a one-digit vocabulary", ["data.vocab_size=1"], "data.vocab_size", "it must be 2 or more"),
    ("unknown operation", ["data.operation=shuffle"], "data.operation", "reverse, sort"),
    ("validation fraction above 1", ["recipe=digits_mlp", "data.validation_fraction=1.5"],
     "data.validation_fraction", "between 0 and 1"),
    # Data: the user's table.
    ("missing data file", [*TABULAR, "data.train=nope.csv"], "data.train", "no such file 'nope.csv'"),
    ("a folder as the data file", [*TABULAR, "data.train=."], "data.train", "'.' is a folder, not a file"),
    ("empty csv", [*TABULAR, "data.train=empty.csv"], "data.train", "empty.csv is empty"),
    ("header-only csv", [*TABULAR, "data.train=header.csv"], "data.train", "has a header and no data rows"),
    ("non-numeric feature", [*TABULAR, "data.train=words.csv"], "column 'b'", "row 2 holds 'red'"),
    ("empty cell", [*TABULAR, "data.train=hole.csv"], "column 'b', row 2", "is empty or NaN"),
    ("an infinite cell", [*TABULAR, "data.train=infinite.csv"], "column 'b', row 2", "is inf, beyond what float32"),
    ("a cell float32 cannot hold", [*TABULAR, "data.train=huge.csv"], "column 'a', row 2",
     "is 1e+300, beyond what float32 holds"),
    ("a single class", [*TABULAR, "data.train=one_class.csv"], "data.label_column", "a single class ('x')"),
    ("unknown label column", [*TABULAR, "data.train=good.csv", "data.label_column=species"], "data.label_column",
     "columns are a, b, c, d, label"),
    ("a file that is not of its format", [*TABULAR, "data.train=not_parquet.parquet"], "data.train",
     "cannot read not_parquet.parquet as parquet: ArrowInvalid"),
    ("a validation file that does not parse", [*TABULAR, "data.train=good.csv", "data.validation=unclosed.csv"],
     "data.validation", "cannot read unclosed.csv as csv: ParserError"),
    ("texts in a file that does not parse", ["recipe=text_classification", "data.train=unclosed.csv"], "data.train",
     "cannot read unclosed.csv as csv: ParserError"),
    ("an empty text", ["recipe=text_classification", "data.train=no_text.csv"], "data.train",
     "no_text.csv, column 'text', row 2 is empty; every row needs a text"),
    ("numbers where texts go", ["recipe=text_classification", "data.train=numbers_as_text.csv"], "data.train",
     "column 'text' holds int64 values, not text"),
    ("an empty label of a text", ["recipe=text_classification", "data.train=no_label.csv"], "data.train",
     "no_label.csv, column 'label', row 2 is empty; every row needs a label"),
    ("text in another encoding", ["recipe=gpt", "data.train=latin1.txt"], "data.train",
     "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9 in position 3: invalid continuation byte; it is "
     "not utf-8 text: set data.encoding"),
    ("an empty text file", ["recipe=gpt", "data.train=empty.txt"], "data.train", "empty.txt is empty; give text"),
    ("a validation file with other columns", [*TABULAR, "data.train=good.csv", "data.validation=other_columns.csv"],
     "data.validation", "other_columns.csv has other columns than data.train (good.csv): it lacks d; it has e, "
                        "which good.csv does not"),
    ("unknown feature column", [*TABULAR, "data.train=good.csv", "data.feature_columns=[a,z]"],
     "data.feature_columns", "z not in the data"),
    ("more classes than outputs", [*TABULAR, "data.train=six_classes.csv", "model.out_features=3"],
     "model.out_features", "set model.out_features=6 or more"),
    ("more classes than outputs, in the user's label column",
     [*TABULAR, "data.train=species.csv", "data.label_column=species", "model.out_features=2"], "model.out_features",
     "is 2, but the data's label column 'species' (data.label_column) holds class 2"),
    ("features that do not fit the model", [*TABULAR, "data.train=good.csv", "model.in_features=3"],
     "model.in_features", "model.in_features is 3"),
    ("negative class numbers", [*TABULAR, "data.train=negative.csv"], "data.label_column",
     "must hold class names or class numbers 0, 1, 2"),
    ("sizes the data cannot say", ["model=mlp"], "model.out_features",
     "is null, so the data should say it, but the training split's 'target' column has no class names"),
    # The run dir.
    ("run dir holding the user's files", ["hydra.run.dir=."], "hydra.run.dir", "already holds files that are not"),
    ("run dir that is a file", [f"hydra.run.dir={NOTEBOOK}"], "hydra.run.dir", "is a file, not a folder"),
    ("run dir that cannot be created", ["hydra.run.dir=/proc/runner-cannot-be-here"], "hydra.run.dir",
     "cannot create the run dir"),
]


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """A working directory holding the user's own files (a notebook, their tables, their broken recipe)."""
    (tmp_path / NOTEBOOK).write_text('{"cells": []}\n')
    for name, text in TABLES.items():
        (tmp_path / name).write_text(text)
    for name, data in NOT_UTF8.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "myconf" / "recipe").mkdir(parents=True)
    (tmp_path / "myconf" / "recipe" / "broken.yaml").write_text(BAD_RECIPE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_catalogue_covers_every_kind_of_bad_input():
    assert len(CASES) >= 40 and len({case[0] for case in CASES}) == len(CASES)


NEEDS_NO_CUDA = {"fp8 without a GPU", "a GPU run without CUDA"}  # their message is the one a CPU-only machine gives
NEEDS_NO_MLFLOW = {"an optional logger not installed"}


@pytest.mark.parametrize("name, arguments, key, phrase", [
    pytest.param(*case, marks=[
        pytest.mark.skipif(case[0] in NEEDS_NO_CUDA and __import__("torch").cuda.is_available(),
                           reason="asserts the message of a machine without CUDA"),
        pytest.mark.skipif(case[0] in NEEDS_NO_MLFLOW and __import__("importlib").util.find_spec("mlflow") is not None,
                           reason="asserts the message of a machine without mlflow")])
    for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_names_the_key_and_changes_no_file(user_folder, capsys, name, arguments, key, phrase):
    before = _snapshot(user_folder)
    with pytest.raises(SystemExit) as exit_info:
        main([*TINY_FOR(arguments), *arguments])  # the case last: it wins
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert exit_info.value.code == 1, output
    assert "runner: error:" in captured.err, output
    assert key in captured.err and phrase in captured.err, captured.err
    assert "Traceback" not in output
    # Hydra's and OmegaConf's raw text: a search-path dump, the key's types, an advice the schema then refuses
    assert not re.search(r"Config search path|reference_type=|object_type=|To append to your config", output), output
    assert _snapshot(user_folder) == before  # nothing the user had changed, nothing new (no outputs/ files)
    assert not (user_folder / "outputs").exists() or not any((user_folder / "outputs").rglob("*"))


def TINY_FOR(arguments: list[str]) -> tuple[str, ...]:
    """Small data for the default recipe, so the cases that get as far as building do it in a blink."""
    if any(argument.startswith(("recipe=", "-cd", "data.seq_len", "data.vocab_size")) for argument in arguments):
        return ("trainer.progress_bar=false",)
    return TINY


def test_every_problem_is_reported_at_once(user_folder, capsys):
    with pytest.raises(SystemExit):
        main([*TINY, "trainer.batch_size=0", "trainer.log_every_steps=0", "model._target_=runner.Nope"])
    err = capsys.readouterr().err
    assert "bad config (3 problems):" in err
    for text in ("trainer.batch_size: is 0", "trainer.log_every_steps: is 0", "model._target_: cannot import"):
        assert text in err


def test_failed_run_keeps_an_existing_empty_folder(user_folder, capsys):
    (user_folder / "experiments").mkdir()
    with pytest.raises(SystemExit):
        main(["hydra.run.dir=experiments", "trainer.batch_size=0"])
    assert "trainer.batch_size: is 0" in capsys.readouterr().err
    assert (user_folder / "experiments").is_dir() and not any((user_folder / "experiments").iterdir())


def test_early_failure_removes_only_the_dirs_it_made(user_folder):
    """A failure before training, in a new nested run dir, removes exactly the folders it made."""
    (user_folder / "projects").mkdir()
    (user_folder / "projects" / "README.md").write_text("mine\n")
    with pytest.raises(SystemExit):
        main(["hydra.run.dir=projects/exp/run1", "trainer.batch_size=0"])
    assert sorted(path.name for path in (user_folder / "projects").iterdir()) == ["README.md"]


def test_busy_run_dir_is_refused_naming_the_holder(user_folder, capsys):
    """A second run into a busy run dir is refused."""
    from runner.run.rundir import inspect

    holder = inspect(user_folder / "busy")
    holder.lock()  # what a run in progress holds for its lifetime
    try:
        code = subprocess.run([sys.executable, "-m", "runner", "hydra.run.dir=busy", *TINY], capture_output=True,
                              text=True, cwd=user_folder, timeout=WAIT_S)
    finally:
        holder.unlock()
    assert code.returncode == 1, code.stderr
    assert f"the run dir {user_folder / 'busy'} is in use by another run (pid {os.getpid()} on" in code.stderr
    assert "Traceback" not in code.stdout + code.stderr
    assert not (user_folder / "busy" / ".hydra").exists()  # refused before Hydra wrote its record into it


def test_data_error_exits_1_with_one_paragraph(user_folder):
    """In a subprocess, and no run dir is left."""
    result = run_cli("recipe=tabular_csv", "data.train=words.csv", cwd=user_folder)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("runner: error: data.train: words.csv, column 'b' is "
                                                             "not numeric (row 2 holds 'red')")
    assert "Traceback" not in result.output and not (user_folder / "outputs").exists()


def test_two_process_data_error_names_the_key(user_folder):
    """On two processes: one paragraph, naming the key."""
    result = run_cli("recipe=tabular_csv", "data.train=six_classes.csv", "model.out_features=3", "hardware=multi_cpu",
                     "hardware.start_method=fork", "trainer.progress_bar=false", cwd=user_folder)
    assert result.returncode == 1, result.output
    assert ("runner: error: bad config: model.out_features: is 3, but the data's label column 'label' "
            "(data.label_column) holds class 5") in result.stderr
    # Both ranks read the data and raise the same error; the report names the one that exited first, which under
    # load can be rank 1 (seen in tests/stress.sh).
    assert re.search(r"\(rank [01], before the first optimizer step\)", result.stderr), result.stderr
    assert "Traceback" not in result.output


def test_logging_factories_pass_the_target_checks():
    """logging's dictConfig calls a `()` factory with the keys beside it: the same refusals as a recipe's targets,
    named where the user wrote them; the standard library's handlers and Hydra's own streams pass."""
    from omegaconf import OmegaConf

    from runner.run.compose import logging_problems

    def problems(handler: dict) -> list[str]:
        cfg = OmegaConf.create({"allowed_targets": ["runner.", "torch."], "hydra": {"job_logging": {
            "handlers": {"console": {"class": "logging.StreamHandler", "stream": "ext://sys.stdout"}, "extra": handler}}}})
        return [str(problem) for problem in logging_problems(cfg)]

    assert problems({"class": "logging.FileHandler", "filename": "x.log"}) == []
    assert problems({"()": "torch.load", "f": "evil.pt", "weights_only": False}) == [
        "hydra.job_logging.handlers.extra.(): 'torch.load' without weights_only: true can run code hidden in the "
        "file; set hydra.job_logging.handlers.extra.weights_only=true"]
    assert problems({"()": "os.system", "command": "id"})[0].startswith(
        "hydra.job_logging.handlers.extra.(): 'os.system' runs arbitrary code")
