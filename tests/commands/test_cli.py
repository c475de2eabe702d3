"""End-to-end: the CLI's main() with a command line's overrides, asserting on the run dir it leaves. Runs go
through runner.commands.cli.main in this process (what `python -m runner` calls after its stop-signal handler), which spares
each case the seconds of importing torch, Hydra and datasets in a new process; what only a process shows is run as
one: a run from another working directory by `python -m runner`, and the heap left to the OS at exit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import ROOT, TINY, CliResult, read_jsonl, read_scalars, run_in_process


@pytest.fixture
def run(tmp_path, capsys):
    """Call as run(*overrides) to run main() in a fresh working directory (or cwd=...)."""

    def call(*overrides: str, cwd: Path | None = None) -> CliResult:
        return run_in_process(*overrides, cwd=cwd or tmp_path, capsys=capsys)

    return call


def test_default_run_writes_a_complete_run_dir(run):
    result = run(*TINY, "trainer.max_steps=6", "trainer.log_every_steps=2")
    assert result.returncode == 0, result.output
    run_dir = result.run_dir()
    assert run_dir.parent.parent == result.cwd / "outputs"

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["trainer"]["max_steps"] == 6
    assert config["model"]["_target_"] == "runner.models.SeqTransformer"
    assert config["model"]["max_len"] == 12  # ${data.seq_len} resolved once, in the parent
    assert (run_dir / ".hydra" / "overrides.yaml").is_file()
    assert "step 6: val/loss=" in (run_dir / "runner.log").read_text()  # Python logging lands in Hydra's job log

    losses = read_scalars(run_dir, "train/loss")
    assert [step for step, _ in losses] == [2, 4, 6]
    assert all(0 < value < 5 for _, value in losses)
    assert [step for step, _ in read_scalars(run_dir, "train/lr")] == [2, 4, 6]
    assert all(value > 0 for _, value in read_scalars(run_dir, "train/samples_per_s"))
    (final_step, accuracy), = read_scalars(run_dir, "val/accuracy")
    assert final_step == 6 and 0 <= accuracy <= 1

    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [row["step"] for row in rows if "train/loss" in row] == [2, 4, 6]
    assert [row["val/accuracy"] for row in rows if "val/accuracy" in row] == pytest.approx([accuracy])

    checkpoint = run_dir / "checkpoints" / "step_00000006"
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_00000006"
    weights = load_file(checkpoint / "model.safetensors")
    assert weights["head.weight"].shape == (10, 64)
    state = torch.load(checkpoint / "state.pt", weights_only=True)
    assert state["loop"]["step"] == 6 and state["optimizer"]["state"]
    assert state["scheduler"]["last_epoch"] == 6
    # The final line names the monitored metric's value, the same one TensorBoard holds.
    assert f"val/accuracy={accuracy:.4f}" in result.output


def test_runs_from_any_working_directory(cli, tmp_path):
    """A real `python -m runner` process, started elsewhere: the run dir lands under that directory."""
    elsewhere = tmp_path / "some" / "where"
    elsewhere.mkdir(parents=True)
    result = cli(*TINY, "trainer.max_steps=1", cwd=elsewhere)
    assert result.returncode == 0, result.output
    assert result.run_dir().is_relative_to(elsewhere / "outputs")


def test_two_runs_get_two_run_dirs(run):
    first = run(*TINY, "trainer.max_steps=1")
    second = run(*TINY, "trainer.max_steps=1")
    assert first.returncode == second.returncode == 0
    assert len(second.run_dirs()) == 2


# Each case is a start-up plus two steps: the new recipes get tiny data and a tiny model of their own architecture
# (the recipe's model and data path, not its size), so that every case costs about what process start-up costs.
TINY_MODELS = {
    "gpt": ("model.n_layer=1", "model.n_head=2", "model.n_embd=32"),
    "gpt2_hf": ("model.config.n_layer=1", "model.config.n_head=2", "model.config.n_embd=32"),
    "image_folder": ("model.widths=[8]",),
    "digits_cnn": ("model.widths=[8]",),
    "text_classification": ("model.dim=16", "model.buckets=64",
                            "data.max_length=16"),
}


@pytest.mark.parametrize("recipe", sorted(path.stem for path in (ROOT / "recipes").glob("*.yaml")))
def test_every_recipe_composes_and_runs_two_steps(run, tmp_path, recipe):
    extra = ("data.num_train=256", "data.num_validation=64") if recipe == "reverse" else ()
    if recipe == "tabular_csv":
        table = tmp_path / "iris_like.csv"
        table.write_text(_three_class_csv(rows=90))
        extra = (f"data.train={table}", "data.label_column=species")
    if recipe in ("gpt", "gpt2_hf"):
        if recipe == "gpt2_hf":
            pytest.importorskip("transformers")
        text = tmp_path / "text.txt"
        text.write_text("the cat sat on the mat.\n" * 100)
        extra = (f"data.train={text}", "data.block_size=16", "trainer.eval_batch_size=64")
    if recipe == "image_folder":
        extra = (f"data.train={_png_folder(tmp_path / 'images')}", "data.image_size=8",
                 "trainer.batch_size=8")
    if recipe == "text_classification":
        table = tmp_path / "texts.csv"
        table.write_text("text,label\n" + "".join(f"good fine great {i},pos\nbad awful poor {i},neg\n" for i in range(40)))
        extra = (f"data.train={table}", "data.tokenizer.vocab_size=300")
    extra += TINY_MODELS.get(recipe, ())
    result = run(f"recipe={recipe}", "trainer.max_steps=2", "trainer.progress_bar=false", *extra)
    assert result.returncode == 0, result.output
    (step, _), = read_scalars(result.run_dir(), "val/accuracy")
    assert step == 2


def _png_folder(root):
    """Two classes of 12x10 PNGs: dark and bright."""
    from PIL import Image

    for label, value in (("dark", 20), ("bright", 230)):
        (root / label).mkdir(parents=True)
        for index in range(12):
            Image.new("RGB", (12, 10), (value, value - index, value)).save(root / label / f"{index}.png")
    return root


def _three_class_csv(rows: int) -> str:
    import random

    rng = random.Random(0)
    lines = ["a,b,c,d,species"]
    for index in range(rows):
        label = index % 3
        values = [label + rng.gauss(0, 0.3) for _ in range(4)]
        lines.append(",".join(f"{v:.3f}" for v in values) + f",{['setosa', 'versicolor', 'virginica'][label]}")
    return "\n".join(lines) + "\n"


def test_multirun_gives_each_job_its_own_run_dir(run):
    result = run("-m", "optimizer.lr=1e-3,3e-3", *TINY, "trainer.max_steps=1")
    assert result.returncode == 0, result.output
    dirs = result.run_dirs()
    assert [d.name for d in dirs] == ["0", "1"] and dirs[0].parent.parent.parent.name == "multirun"
    lrs = [yaml.safe_load((d / "config.yaml").read_text())["optimizer"]["lr"] for d in dirs]
    assert lrs == [1e-3, 3e-3]
    assert all(read_scalars(d, "val/accuracy") for d in dirs)


def test_main_returns_the_monitored_metric(tmp_path):
    """Sweepers (Optuna, ...) read the task function's return value: the final value of trainer.monitor."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from runner.run.compose import CONFIG_DIR
    from runner.commands.cli import run_task

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[*TINY, "trainer.max_steps=2", "trainer.monitor=val/loss"],
                      return_hydra_config=True)
    cfg.hydra.runtime.output_dir = str(tmp_path / "run")
    (tmp_path / "run").mkdir()
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    value = run_task(cfg)
    (step, logged), = read_scalars(tmp_path / "run", "val/loss")
    assert step == 2 and value == pytest.approx(logged, rel=1e-6)


def test_a_run_leaves_its_heap_to_the_os_at_exit(tmp_path):
    """After a run the process exits without the garbage collector's pass over everything torch, datasets and Hydra
    built (runner/launch/shutdown.py: 1.1 s of every run's end): the heap is frozen when exit handlers run. The probe's
    handler is registered before the run's, so it runs after it (atexit is last-in, first-out)."""
    import subprocess
    import sys

    probe = ("import atexit, gc, sys\n"
             "atexit.register(lambda: print('frozen at exit', gc.get_freeze_count()))\n"
             "from runner.commands.cli import main\n"
             "main(sys.argv[1:])\n")
    done = subprocess.run([sys.executable, "-c", probe, *TINY, "trainer.max_steps=1", f"hydra.run.dir={tmp_path}/run"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    frozen = int(done.stdout.split("frozen at exit")[-1])
    assert frozen > 100_000, done.stdout[-500:]  # torch alone holds more


def test_help_lists_every_command_before_the_config(capsys):
    import importlib

    from runner.commands.cli import COMMANDS, main

    try:
        main(["--help"])
    except SystemExit as ended:
        assert ended.code in (None, 0)
    out = capsys.readouterr().out
    listed = [line.split()[1] for line in out.splitlines() if line.startswith("  runner ")]
    assert listed == ["recipes", "launch", "machine", "plan", "sample", "env"]
    assert out.index("  runner env") < out.index("== Configuration groups ==")  # Hydra's help follows
    for module, _ in COMMANDS.values():  # each line names a command that runs
        assert callable(importlib.import_module(module).main)


def test_version_and_each_commands_help(capsys):
    """--version is the runner's (Hydra's flag named only Hydra's), and --help of each command prints its usage
    and exits 0 (it was taken for an override, a run dir or a script)."""
    from importlib import metadata

    from runner.commands.cli import main

    main(["--version"])
    assert capsys.readouterr().out.startswith(f"runner-ml {metadata.version('runner-ml')} (Hydra ")
    for command in ("plan", "sample", "launch"):
        try:
            main([command, "--help"])
        except SystemExit as ended:
            assert ended.code in (None, 0), command
        captured = capsys.readouterr()
        assert captured.out.startswith("usage: ") and "runner: error" not in captured.err, command


def test_a_missing_run_dir_for_sample_is_named(tmp_path, monkeypatch, capsys):
    from runner.commands.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        main(["sample", "nope"])
    assert ended.value.code == 1
    assert f"sample: no such run dir or file 'nope' (looked in {tmp_path})" in capsys.readouterr().err


def test_gpt_vocab_is_the_learnt_tokenizer_size(run, tmp_path):
    """model.vocab_size: null becomes the trained tokenizer's size, not its cap (256): the first loss is about ln V,
    and the checkpoint's and the export's config.yaml record V, which `runner sample` rebuilds the model from."""
    import math

    from runner.commands.sample import SampleSettings, sample

    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat.\n" * 100)
    size = len(set(text.read_text())) + 2  # every character, <pad> and <unk>
    result = run("recipe=gpt", f"data.train={text}", "data.block_size=16", "trainer.max_steps=2",
                 "trainer.log_every_steps=1", "trainer.progress_bar=false", *TINY_MODELS["gpt"])
    assert result.returncode == 0, result.output
    run_dir = result.run_dir()
    for config_file in (run_dir / "export" / "config.yaml", run_dir / "checkpoints" / "step_00000002" / "config.yaml"):
        assert yaml.safe_load(config_file.read_text())["model"]["vocab_size"] == size, config_file
    weights = load_file(run_dir / "export" / "final.safetensors")  # tied: the embedding is saved as the head
    assert weights["head.weight"].shape == (size, 32)
    (step, first_loss), *_ = read_scalars(run_dir, "train/loss")
    assert step == 1 and first_loss == pytest.approx(math.log(size), abs=0.25)  # small initial logits: ~uniform
    texts = sample(run_dir, SampleSettings(prompt="the ", max_new_tokens=20, top_k=None, num_samples=2))
    assert all(text_.startswith("the ") and set(text_) <= set(text.read_text()) for text_ in texts)


@pytest.mark.parametrize("command", [["--help"], ["env"]])  # Hydra's help; a command of the runner's own
def test_a_reader_that_leaves_early_gets_no_traceback(command):
    """`runner --help | head`: the pipe's reader is gone before the output is written. The command stops quietly
    with 128 + SIGPIPE, as `git log | head` does, and prints no BrokenPipeError traceback."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "runner", *command], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, cwd=ROOT)
    process.stdout.close()  # long before the interpreter has started: every write meets a pipe without a reader
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
