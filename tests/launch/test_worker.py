"""runner/launch/worker.py: what a worker hands the checkpoint code when it resumes."""

from __future__ import annotations

from pathlib import Path


def test_machine_1_resumes_machine_0s_checkpoint(tmp_path, caplog):
    """As an exact continuation (no warning); any other config difference still warns."""
    from checkpoint_helpers import RESOLVED, checkpointer_in, save_step, trained_objects
    from runner.launch.worker import as_machine_0
    from runner.training.checkpointer import restore

    written = {**RESOLVED, "hardware": {"num_machines": 2, "machine_rank": 0}}
    checkpointer = checkpointer_in(tmp_path)
    checkpointer.resolved = written
    path = save_step(checkpointer, *trained_objects(), step=1)
    on_machine_1 = {**written, "hardware": {"num_machines": 2, "machine_rank": 1}}
    with caplog.at_level("WARNING"):
        restore(path, trained_objects()[0], world_size=1, resolved=as_machine_0(on_machine_1))
    assert "no longer an exact continuation" not in caplog.text
    with caplog.at_level("WARNING"):  # any other difference still counts
        restore(path, trained_objects()[0], world_size=1, resolved=as_machine_0({**on_machine_1, "seed": 99}))
    assert "no longer an exact continuation" in caplog.text


def test_library_warnings_go_to_the_log_file_only(tmp_path):
    import io
    import logging
    import sysconfig
    import warnings

    from runner.launch.worker import library_warnings_to_the_log_file

    root = logging.getLogger()
    saved = list(root.handlers)
    console, log_file = logging.StreamHandler(io.StringIO()), logging.FileHandler(tmp_path / "runner.log")
    root.handlers[:] = [console, log_file]
    # pytest records warnings itself; a capture left on by an earlier in-process run would stay in its way.
    logging.captureWarnings(False)
    try:
        library_warnings_to_the_log_file()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            library = str(Path(sysconfig.get_path("purelib")) / "torch" / "distributed" / "fsdp.py")
            warnings.warn_explicit("returned a view tensor", UserWarning, filename=library, lineno=1)
            warnings.warn_explicit("my own warning", UserWarning, filename=str(tmp_path / "train.py"), lineno=3)
    finally:
        logging.captureWarnings(False)
        root.handlers[:] = saved
        log_file.close()
    shown = console.stream.getvalue()
    assert "my own warning" in shown and "returned a view tensor" not in shown
    kept = (tmp_path / "runner.log").read_text()
    assert "my own warning" in kept and "returned a view tensor" in kept


def test_one_process_takes_the_threads_it_was_given(tmp_path, monkeypatch):
    """hardware.threads_per_process (or SLURM_CPUS_PER_TASK) applies to a one-process run too, not only to ranks:
    two 1-CPU jobs on one node would otherwise each run a thread per core."""
    import torch

    from runner.commands.cli import main

    monkeypatch.chdir(tmp_path)
    before = torch.get_num_threads()
    try:
        main(["debug=fast", "hydra.run.dir=given", "hardware.threads_per_process=1"])
        assert torch.get_num_threads() == 1
        torch.set_num_threads(before)
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")  # sbatch -c 1, nothing set in the config
        main(["debug=fast", "hydra.run.dir=slurm"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
