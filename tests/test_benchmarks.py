"""Smoke test of benchmarks/overhead.py: each section runs a handful of steps and reports in the promised shape.

Timings are never asserted: they belong to the benchmark, whose output the README quotes.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import ROOT, read_jsonl


def _load_overhead():
    spec = importlib.util.spec_from_file_location("overhead", ROOT / "benchmarks" / "overhead.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


overhead = _load_overhead()
TINY = overhead.WORKLOADS["tiny"]


def assert_spread(stats: dict) -> None:
    assert set(stats) == {"median", "min", "max"}
    assert stats["min"] <= stats["median"] <= stats["max"]


@pytest.fixture(scope="module")
def results():
    """Every section, with a handful of steps, one or two pairs."""
    return {
        "tiny": overhead.compare_loops(TINY, pairs=2, steps=8, warmup=2, rounds=2),
        "malloc": {"tiny": overhead.compare_malloc(TINY, pairs=1, steps=4, warmup=2, rounds=2)},
        "data": overhead.data_path(pairs=1, rows=1024, batch_size=64, epochs=1),
        "startup": overhead.startup(pairs=1),
    }


def test_both_arms_train_the_same_steps(tmp_path):
    data = overhead.make_data(TINY)
    plain = overhead.plain_fit(TINY, 3, data)
    runner = overhead.runner_fit(TINY, 3, overhead.to_splits(data), tmp_path)
    assert set(plain) == set(runner) == {"wall", "cpu"}
    assert all(value > 0 for value in (*plain.values(), *runner.values()))
    # The runner arm is the real loop: it logged the last step's loss and one final evaluation.
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [row["step"] for row in rows if "train/loss" in row] == [3]
    assert [row["step"] for row in rows if "val/accuracy" in row] == [3]
    assert (tmp_path / "tensorboard").is_dir() and not (tmp_path / "checkpoints").exists()


def test_loop_comparison_reports_per_pair_spreads(results):
    loops = results["tiny"]
    assert loops["workload"] == "Linear 32-10, batch 64" and loops["steps"] == 8
    for key in ("plain_ms", "runner_ms", "ratio", "overhead_ms", "cpu_ratio", "cpu_overhead_ms"):
        assert_spread(loops[key])
    assert loops["plain_ms"]["min"] > 0 and loops["ratio"]["min"] > 0
    malloc = results["malloc"]["tiny"]
    for key in ("default_ms", "pinned_ms", "speedup", "cpu_speedup"):
        assert_spread(malloc[key])


def test_data_path_and_startup_sections(results):
    data = results["data"]
    assert (data["rows"], data["batch_size"]) == (1024, 64)
    for name in ("tensors", "index_select", "arrow"):
        for key in ("runner_batches_per_s", "plain_batches_per_s", "ratio"):
            assert_spread(data[name][key])
    assert data["arrow"]["vs_tensors"] > 0
    startup = results["startup"]
    for key in ("plain_s", "plain_with_libraries_s", "runner_s", "runner_to_worker_s", "added_s", "added_own_s",
                "accelerator_s", "accelerator_ratio"):
        assert_spread(startup[key])
    assert startup["accelerator_ratio"]["median"] > 0
    # The worker starts after the process does and before the first optimizer step.
    assert 0 < startup["runner_to_worker_s"]["median"] < startup["runner_s"]["median"]


def test_report_has_a_table_row_and_a_verdict_per_target(results):
    text = overhead.report(results, pairs=2)
    lines = text.splitlines()
    assert lines[0].startswith("runner overhead vs plain PyTorch") and "2 pairs" in lines[0]
    assert any(line.startswith("  tiny  Linear 32-10, batch 64, 8 steps") for line in lines)
    verdicts = [line for line in lines if line.split(" ", 1)[0] in ("PASS", "MISS")]
    assert [line.split(" ", 2)[1] for line in verdicts] == ["tiny:", "data/tensors:", "data/arrow:", "startup:"]
    assert "target <= +0.05 ms" in verdicts[0] and "target >= 0.9x" in verdicts[1]
    infos = [line.split(" ", 2)[1] for line in lines if line.startswith("INFO ")]
    assert infos == ["malloc/tiny:", "data/index_select:", "data/arrow:", "startup:"]


def test_unknown_section_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        overhead.main(["--only", "tiny,speed"])
    assert exit_info.value.code == 2
    assert "unknown section(s) speed; choose from mlp, tiny, malloc, data, startup" in capsys.readouterr().err


def test_the_runner_arm_reads_the_device_per_log_not_per_step(tmp_path, monkeypatch):
    """No host-device sync on the hot path: 20 steps logged every 10 read the loss twice; the only other reads are
    the one-batch check before the first step and the final evaluation's sums. On a GPU each read is a sync.
    (torch's AdamW reads its CPU step counter itself.)"""
    import sys

    import torch

    runner_dir = str(ROOT / "runner")
    reads = []
    for name in ("item", "tolist", "__float__", "__bool__", "__int__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_code
            if caller.co_filename.startswith(runner_dir):
                reads.append((_name, caller.co_name))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    splits = overhead.to_splits(overhead.make_data(TINY))
    overhead.runner_fit(TINY, 20, splits, tmp_path)
    training = [read for read in reads if read[1] not in ("check_fit", "summarize", "macro_f1")]
    assert training == [("item", "log_train")] * 2
    first_training_read = reads.index(("item", "log_train"))
    assert {name for _, name in reads[:first_training_read]} == {"check_fit"}  # before the first step only
    assert {name for _, name in reads[first_training_read + 2:]} <= {"summarize", "macro_f1"}


def test_the_accelerate_arm_trains_the_same_loop_and_reports_its_ratio():
    row = overhead.compare_accelerate(TINY, pairs=1, steps=4, warmup=2, rounds=2)
    assert row is not None, "accelerate is in the test extra"
    assert row["workload"] == "Linear 32-10, batch 64" and row["steps"] == 4
    for key in ("ratio", "cpu_ratio", "overhead_ms"):
        assert_spread(row[key])
    assert row["ratio"]["median"] > 0
    text = overhead.report({"accelerate": {"tiny": row, "mlp": None}}, pairs=1)
    assert "HuggingFace Accelerate vs the same plain loop" in text
    assert "mlp   not measured: accelerate is not installed" in text
