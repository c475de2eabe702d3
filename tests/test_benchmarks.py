"""Smoke test of the benchmarks: each section of benchmarks/overhead.py, benchmarks/distributed.py and
benchmarks/checkpoint.py runs a handful of steps with every arm (plain, runner, Accelerate, Fabric) and reports in
the promised shape, and benchmarks/compare.py puts them in one table.

Timings are never asserted: they belong to the benchmark, whose output the README quotes.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import ROOT, read_jsonl


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


compare = _load("compare")
overhead = compare.overhead
TINY = overhead.WORKLOADS["tiny"]


def assert_spread(stats: dict) -> None:
    assert set(stats) == {"median", "min", "max"}
    assert stats["min"] <= stats["median"] <= stats["max"]


ARMS = ("plain", "runner", "accelerate", "fabric")  # accelerate and lightning-fabric are in the test extra


@pytest.fixture(scope="module")
def results():
    """Every section, with a handful of steps, one or two pairs; the start-up commands are each launched once (no
    warm-up runs: their timings are not asserted)."""
    return {
        "tiny": overhead.compare_loops(TINY, pairs=2, steps=8, warmup=2, rounds=2),
        "malloc": {"tiny": overhead.compare_malloc(TINY, pairs=1, steps=4, warmup=2, rounds=2)},
        "data": overhead.data_path(pairs=1, rows=1024, batch_size=64, epochs=1),
        "startup": overhead.startup(pairs=1, warmup=False),
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


@pytest.mark.parametrize("name", ["accelerate", "fabric"])
def test_framework_arms_train_the_plain_loop(name, monkeypatch):
    """The Accelerate and Fabric arms run the plain loop's very steps, with the model and optimizer set up by the
    framework and the loss through its backward: the same weights as the plain loop after the same steps."""
    import torch

    framework = overhead.alternatives.framework(name)
    calls = []
    setup, backward = framework.setup, framework.backward
    framework.setup = lambda *objects: calls.append("setup") or setup(*objects)
    framework.backward = lambda loss: calls.append("backward") or backward(loss)
    models, make_model = [], overhead.make_model
    monkeypatch.setattr(overhead, "make_model", lambda workload: models.append(make_model(workload)) or models[-1])
    data = overhead.make_data(TINY)
    torch.manual_seed(5)
    overhead.plain_fit(TINY, 4, data, framework)
    torch.manual_seed(5)
    overhead.plain_fit(TINY, 4, data)
    assert calls == ["setup"] + ["backward"] * 4
    wrapped, plain = (torch.cat([p.detach().flatten() for p in model.parameters()]) for model in models)
    assert torch.equal(wrapped, plain)


def test_loops_interleave_every_arm_against_plain(results):
    loops = results["tiny"]
    assert loops["workload"] == "Linear 32-10, batch 64" and loops["steps"] == 8
    assert tuple(loops["arms"]) == ARMS and loops["missing"] == []
    for arm, stats in loops["arms"].items():
        for key in ("ms", "cpu_ms", "ratio", "cpu_ratio", "overhead_ms", "cpu_overhead_ms"):
            assert_spread(stats[key])
        assert stats["ms"]["min"] > 0 and stats["ratio"]["min"] > 0
    plain = loops["arms"]["plain"]
    assert plain["ratio"] == plain["cpu_ratio"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    assert plain["overhead_ms"] == {"median": 0.0, "min": 0.0, "max": 0.0}
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
                "runner_exit_s", "plain_with_libraries_exit_s"):
        assert_spread(startup[key])
    # The raw script on runner.Accelerator, on Accelerate and on Fabric, each against the raw script.
    assert tuple(startup["script_on"]) == ("runner", "accelerate", "fabric") and startup["missing"] == []
    for stats in startup["script_on"].values():
        assert_spread(stats["s"]), assert_spread(stats["ratio"])
        assert stats["ratio"]["median"] > 0
    # The worker starts after the process does and before the first optimizer step.
    assert 0 < startup["runner_to_worker_s"]["median"] < startup["runner_s"]["median"]
    # Every process outlives its last write, and the runner's exit skips the collector (runner/launch/shutdown.py).
    assert 0 < startup["runner_exit_s"]["median"] < startup["runner_s"]["median"]
    assert 0 < startup["plain_with_libraries_exit_s"]["median"]


def test_report_has_arm_rows_and_target_verdicts(results):
    text = overhead.report(results, pairs=2)
    lines = text.splitlines()
    assert lines[0].startswith("runner overhead vs plain PyTorch") and "2 pairs" in lines[0]
    assert "loop tiny: Linear 32-10, batch 64, 8 steps (malloc pinned in every arm)" in lines
    for label in ("plain PyTorch", "runner", "HuggingFace Accelerate", "Lightning Fabric"):
        assert any(line.startswith(f"  {label} ") for line in lines), label
    for label in ("runner.Accelerator", "HuggingFace Accelerate", "Lightning Fabric"):
        assert any(line.startswith(f"  plain script on {label} ") for line in lines), label
    verdicts = [line for line in lines if line.split(" ", 1)[0] in ("PASS", "MISS")]
    assert [line.split(" ", 2)[1] for line in verdicts] == ["tiny:", "data/tensors:", "data/arrow:", "startup:",
                                                            "startup/accelerator:"]
    assert "target <= +0.05 ms" in verdicts[0] and "target >= 0.9x" in verdicts[1]
    assert "target <= +0.3 s" in verdicts[3] and "target <= 1.02x" in verdicts[4]
    infos = [line.split(" ", 2)[1] for line in lines if line.startswith("INFO ")]
    assert infos == ["malloc/tiny:", "data/index_select:", "data/arrow:", "startup:", "stopping:"]
    assert any(line.startswith("  last write to process exit (stopping) ") for line in lines)


def test_an_uninstalled_arm_is_skipped_with_a_note(monkeypatch):
    monkeypatch.setattr(overhead.alternatives, "installed", lambda arm: arm != "fabric")
    row = overhead.compare_loops(TINY, pairs=1, steps=4, warmup=2, rounds=2, arms=("plain", "runner", "fabric"))
    assert tuple(row["arms"]) == ("plain", "runner")
    note = ("Lightning Fabric: not measured (lightning_fabric is not installed: pip install 'accelerate>=1.0' "
            "'lightning-fabric>=2.4' (the 'bench' extra of runner-ml))")
    assert row["missing"] == [note]
    assert f"  {note}" in overhead.report({"tiny": row}, pairs=1).splitlines()


@pytest.fixture(scope="module")
def distributed_results():
    """One round of 20 steps (two logging windows, the fewest a steps/s figure needs) on 2 gloo processes: each
    arm launched once, its first step's time read from that run, with no warm-up launches."""
    return compare.distributed.measure(1, extra_startup=False, steps=20, warmup=False, separate_start=False)


@pytest.fixture(scope="module")
def checkpoint_results(tmp_path_factory):
    return compare.checkpoint.measure(1, 1, tmp_path_factory.mktemp("ckpt"))


def test_every_arm_trains_on_two_processes(distributed_results):
    """Each arm's steps/s and its ratio to plain PyTorch are reported."""
    assert distributed_results["steps"] == 20 and distributed_results["missing"] == []
    assert tuple(distributed_results["arms"]) == ARMS
    for arm, row in distributed_results["arms"].items():
        for key in ("steps_per_s", "ratio", "cpu_ratio", "first_step_s"):
            assert_spread(row[key])
        assert row["steps_per_s"]["min"] > 0 and row["first_step_s"]["min"] > 0, arm
    assert distributed_results["arms"]["plain"]["ratio"]["median"] == 1.0
    # (Each script arm asserted in the benchmark that its two replicas ended with equal weights.)
    text = compare.distributed.report(distributed_results, 1, "2 cores")
    for label in compare.distributed.LABELS.values():
        assert f"  {label} " in text
    verdicts = [line.split(":")[0] for line in text.splitlines() if line.split(" ", 1)[0] in ("PASS", "MISS")]
    assert [verdict.split(" ", 1)[1] for verdict in verdicts] == ["2-process throughput", "2-process start"]


def test_every_arm_saves_and_loads_the_same_weights(checkpoint_results):
    times = checkpoint_results["times"]
    expected = {f"{arm} {what}" for arm in ARMS for what in ("save", "load")}
    assert set(times) == expected | {"runner save until sealed", "runner load, verify=false"}
    assert all(len(row["values"]) == 1 and row["median"] > 0 for row in times.values())
    assert times["runner save until sealed"]["median"] >= times["runner save"]["median"]
    text = compare.checkpoint.report(checkpoint_results)
    assert "accelerate save" in text and "fabric load" in text and "x plain" in text


def test_object_storage_benchmark_saves_and_fetches(tmp_path, monkeypatch):
    """--object-storage moto: moto's S3 server started by the benchmark, the runner's checkpoint committed there and
    fetched back (each load is checked to give the saved weights), reported with bytes per second."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "")  # start_moto sets them; monkeypatch puts them back after
    server, url = compare.checkpoint.start_moto(tmp_path / "moto")
    try:
        result = compare.checkpoint.measure_object_storage(1, 1, tmp_path, url)
    finally:
        server.terminate()
        server.wait()
    assert set(result["times"]) == {"local save until sealed", "save until committed to storage", "local load",
                                    "load fetched from storage"}
    assert result["bytes"] > 12e6 and all(value > 0 for value in result["times"].values())  # 1M params + AdamW
    text = compare.checkpoint.report_object_storage(result)
    assert "MB/s" in text and "x local" in text and url in text


def test_finite_check_benchmark_saves_both_ways(tmp_path):
    """Checked and unchecked; the report gives the check's share of the save (target <= 5%)."""
    result = compare.checkpoint.measure_finite_check(1, 2, tmp_path)
    assert set(result) == {"save, checked", "save, unchecked", "until sealed, checked", "until sealed, unchecked",
                           "check alone", "save: checked / unchecked, paired",
                           "until sealed: checked / unchecked, paired"}
    assert all(value > 0 for value in result.values())
    from runner.training import checkpointer

    assert checkpointer.tensors_are_finite.__name__ == "tensors_are_finite"  # put back
    assert "(target <= 5%)" in compare.checkpoint.report_finite_check(result)


def test_the_table_has_arm_columns_and_measure_rows(results, distributed_results, checkpoint_results):
    # The tiny loop stands in for the MLP row too: the same code path, a fraction of the time.
    table = {**results, "mlp": results["tiny"], "distributed": distributed_results, "checkpoint": checkpoint_results}
    lines = compare.table(table).splitlines()
    assert lines[0] == "| | plain PyTorch | runner | HuggingFace Accelerate | Lightning Fabric |"
    rows = [line.split(" | ") for line in lines[2:]]
    assert [row[0].split(",")[0] for row in rows] == [
        "| per-step time", "| steps/s", "| start-up of a script to its first step", "| start-up of `python -m runner`",
        "| stopping: last write to process exit", "| 2 processes", "| 2 processes", "| checkpoint save", "| checkpoint load"]
    assert all(len(row) == 5 for row in rows)
    # A figure in every cell but the CLI start-up and stopping rows' framework cells, which have no such command.
    for row in rows:
        cells = [cell.strip(" |") for cell in row[1:]]
        figures = cells[:2] if "python -m runner" in row[0] or "stopping" in row[0] else cells
        assert all(cell and cell[0] in "+-0123456789" for cell in figures), row
    assert rows[0][1].endswith(" ms") and rows[0][2].startswith(("+", "-"))


def test_baselines_score_the_recipe_validation_split(tmp_path):
    """benchmarks/baselines.py fits scikit-learn on exactly the rows the recipe trains on and scores the rows it
    validates on: the same hold-out as runner.data.text_classification and sklearn_digits."""
    pytest.importorskip("sklearn")
    from runner.data import text_classification
    from runner.data.tokenizers import CharLevel

    baselines = _load("baselines")
    table = tmp_path / "texts.csv"
    rows = [(f"good fine great {i}", "pos") if i % 2 else (f"bad awful poor {i}", "neg") for i in range(60)]
    table.write_text("text,label\n" + "".join(f"{text},{label}\n" for text, label in rows))
    scores = baselines.text_baselines(table)
    assert set(scores) == {"TF-IDF + logistic regression (defaults)",
                           "word 1-2 + char 2-5-gram TF-IDF + logistic regression"}
    assert all(score == 1.0 for score in scores.values()), scores  # the words give the label away
    held_out = baselines.hold_out(table)[1]
    recipe_split = text_classification(str(table), CharLevel())["validation"]
    assert len(held_out) == len(recipe_split) == 12
    assert held_out["label"] == [recipe_split.dataset.features["label"].int2str(label)
                                 for label in recipe_split.dataset["label"]]
    assert 0.98 < baselines.digits_baseline() < 1.0  # an RBF SVC on the bundled digits' 360 held-out images


def test_precision_benchmark_reports_speed_and_loss(tmp_path):
    """benchmarks/precision.py: a row per precision with steps/s against fp32 and the loss after the same steps,
    against fp32's (the fp32 row's difference is zero; bf16's is small but its own)."""
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "precision.py"), "--steps", "6", "--rounds", "1",
                           "--width", "32", "--batch-size", "16"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].split() == ["precision", "plain", "steps/s", "vs", "fp32", "runner", "steps/s", "vs", "fp32",
                                "runner/plain", "loss@6", "vs", "fp32"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert set(rows) == {"fp32", "bf16", "fp16"}
    assert rows["fp32"][1] == rows["fp32"][3] == "1.00" and rows["fp32"][6] == "+0.0000"
    for precision in ("bf16", "fp16"):
        loss, difference = float(rows[precision][5]), float(rows[precision][6])
        assert difference == pytest.approx(loss - float(rows["fp32"][5]), abs=2e-4)  # both printed to 4 places
        assert abs(difference) < 0.05  # 6 steps of a 32-wide MLP: rounding, not divergence
