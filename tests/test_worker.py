"""runner/launch/worker.py: what a worker hands the checkpoint code when it resumes."""

from __future__ import annotations


def test_machine_1_resuming_machine_0_s_checkpoint_is_an_exact_continuation(tmp_path, caplog):
    from runner.training.checkpointer import restore
    from runner.launch.worker import as_machine_0
    from test_checkpoint import RESOLVED, _checkpointer, _objects, _save

    written = {**RESOLVED, "hardware": {"num_machines": 2, "machine_rank": 0}}
    checkpointer = _checkpointer(tmp_path)
    checkpointer.resolved = written
    path = _save(checkpointer, *_objects(), step=1)
    on_machine_1 = {**written, "hardware": {"num_machines": 2, "machine_rank": 1}}
    with caplog.at_level("WARNING"):
        restore(path, _objects()[0], world_size=1, resolved=as_machine_0(on_machine_1))
    assert "no longer an exact continuation" not in caplog.text
    with caplog.at_level("WARNING"):  # any other difference still counts
        restore(path, _objects()[0], world_size=1, resolved=as_machine_0({**on_machine_1, "seed": 99}))
    assert "no longer an exact continuation" in caplog.text
