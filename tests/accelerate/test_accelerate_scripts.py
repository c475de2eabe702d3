"""HuggingFace Accelerate's own test scripts (accelerate/test_utils/scripts, from the installed Accelerate) run with
only `from accelerate... import Accelerator` swapped for `from runner import Accelerator`, on 1 and 2 CPU processes
(`python -m runner.launch` starts the two, as `accelerate launch` would). test_sync.py and
test_distributed_data_loop.py run whole and must exit 0 having run their checks; the checks of test_script.py,
external_deps/test_metrics.py, test_ops.py and test_sync.py's multi-GPU cells run one by one from a harness (CELLS).

A check the runner leaves out by design is replaced by `pass` here and listed in LEFT_OUT, or left out of the
harness and listed in CELLS_LEFT_OUT, with why (the docs' Accelerate table says the same): those reach into
Accelerate's internals, need what the runner refuses, or run on GPUs only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from conftest import ROOT, WAIT_S
from runner.accelerate.dataloader import fork_deadlock_risk

accelerate = pytest.importorskip("accelerate", reason="the test extra installs accelerate")
SCRIPTS = Path(accelerate.__file__).parent / "test_utils" / "scripts"
IMPORTS = ("from accelerate.accelerator import Accelerator", "from accelerate import Accelerator")

LEFT_OUT = {
    "test_distributed_data_loop.py": {
        "    accelerator.state.distributed_type = DistributedType.FSDP":
            "assigns Accelerate's AcceleratorState; runner.Accelerator's state is the Accelerator, read-only",
        "    test_join_raises_warning_for_non_ddp_distributed(accelerator)":
            "expects Accelerate's warning that joining has no effect outside multi-GPU; the runner joins on CPU too",
        "    accelerator.state.distributed_type = original_state": "(the assignment above, undone)",
        "    test_pickle_accelerator()":
            "compares AcceleratorState.__dict__ after pickling; the runner's state holds the prepared objects",
        "    test_stateful_dataloader(accelerator)":
            "use_stateful_dataloader=True (torchdata) is refused: resume mid-epoch with skip_first_batches",
        "    test_stateful_dataloader_save_state(accelerator)": "(the same)",
    },
    "external_deps/test_metrics.py": {
        "import evaluate": "the `evaluate` package is not a dependency; the cells that use it (test_mrpc) run only "
                           "on a GPU in the script's main()",
    },
}


def swapped(script: str, directory: Path) -> Path:
    """The installed script with the runner's Accelerator imported, and the LEFT_OUT lines replaced by `pass`
    (test_ops.py, which imports no Accelerator, as it is: the harness below hands it the runner's)."""
    text = (SCRIPTS / script).read_text(encoding="utf-8")
    names = [line for line in text.splitlines() if line.startswith(IMPORTS)]
    assert len(names) == (0 if script == "test_ops.py" else 1), f"{script}: imports of Accelerator: {names}"
    for name in names:
        text = text.replace(name, name.replace("from accelerate.accelerator import", "from runner import")
                            .replace("from accelerate import Accelerator", "from runner import Accelerator"))
    for line, why in LEFT_OUT.get(script, {}).items():
        assert f"\n{line}\n" in text, f"{script} no longer has {line.strip()!r}: update LEFT_OUT"
        text = text.replace(f"\n{line}\n", f"\n{line[:len(line) - len(line.lstrip())]}pass  # left out: {why}\n")
    path = directory / Path(script).name
    path.write_text(text, encoding="utf-8")
    return path


def run(script: Path, processes: int, timeout: float = 600) -> subprocess.CompletedProcess:
    launch = [] if processes == 1 else ["-m", "runner.launch", "hardware=multi_cpu",
                                        f"hardware.num_processes={processes}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *launch, str(script)], cwd=script.parent, env=env, capture_output=True,
                          text=True, timeout=timeout)


def end_processes_in(directory: Path) -> None:
    """SIGKILL every process whose working directory is `directory` (Linux's /proc; elsewhere nothing)."""
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            if cwd.resolve() == directory.resolve():
                os.kill(int(cwd.parent.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


@pytest.mark.parametrize("processes", [1, 2])
def test_accelerates_test_sync_passes(tmp_path, processes):
    """no_sync, accumulate with a loader break, gradient accumulation with optimizer and scheduler."""
    result = run(swapped("test_sync.py", tmp_path), processes)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ran = "Test Distributed `no_sync` context manager" if processes == 2 else "Test NOOP `no_sync` context manager"
    assert ran in result.stdout and "gradient accumulation with optimizer and scheduler" in result.stdout


def test_accelerates_test_distributed_data_loop_passes(tmp_path):
    """even_batches, join_uneven_inputs and its overrides, and every DataLoader kind, on 2 processes (the script
    asserts it has 2). Its DataLoaders fork 4 workers each right after collectives: on a Python with CPython
    gh-112275 (runner/accelerate/dataloader.py) the runner warns, and a worker hung at its start (about 1 run in
    145 here) gets the script one more run; a hang on a Python without the bug fails at once."""
    script = swapped("test_distributed_data_loop.py", tmp_path)
    affected = bool(fork_deadlock_risk(DataLoader(range(1), num_workers=1), 2))  # this Python, forked workers
    try:
        result = run(script, 2, timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        end_processes_in(tmp_path)  # the hung worker outlives its rank, in a session of its own
        if not affected:
            raise
        result = run(script, 2, timeout=WAIT_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert ("(CPython gh-112275, fixed in Python" in result.stderr) == affected, result.stderr[-3000:]
    for check in ("Test joining uneven inputs", "Test overriding even_batches raises a warning for iterable",
                  "Test DataLoader with sampler as an instance of `BatchSampler`"):
        assert check in result.stdout + result.stderr, check


# The checks of test_script.py, external_deps/test_metrics.py, test_ops.py and (on 2 processes) test_sync.py that
# run on an Accelerator of their own, each called in turn by one harness (one launch for all), its result printed,
# so that one failing check does not hide the others. Each section says which checks its script's main() runs and
# which are left out, and why.
CELLS = """
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runner import Accelerator, DataLoaderConfiguration

accelerator = Accelerator(cpu=True)
cells = {}

# test_script.py: only these four of its checks build an Accelerator; the others call Accelerate's own
# AcceleratorState, PartialState or prepare_data_loader, so they test Accelerate whatever Accelerator is imported.
import test_script
for name in ("process_execution_check", "check_seedable_sampler", "check_seedable_sampler_with_data_seed",
             "test_trigger"):
    cells[f"test_script {name}"] = (getattr(test_script, name),)

# external_deps/test_metrics.py: what its main() runs on a CPU, each on its own Accelerator as main() builds them:
# test_torch_metrics for each split_batches and dispatch_batches (99 samples), with 512 (the last batch not
# dropped when it divides evenly), and test_gather_for_metrics_drop_last. (main() runs test_mrpc and the
# iterable-dataset checks only on a GPU; test_mrpc needs `evaluate`, not a dependency.)
import test_metrics

def torch_metrics(split_batches, dispatch_batches, length):
    config = DataLoaderConfiguration(split_batches=split_batches, dispatch_batches=dispatch_batches)
    test_metrics.test_torch_metrics(Accelerator(dataloader_config=config), length)

for split in (True, False):
    for dispatch in (True, False):
        cells[f"test_metrics test_torch_metrics {split=} {dispatch=} length=99"] = (torch_metrics, split, dispatch, 99)
cells["test_metrics test_torch_metrics length=512"] = (torch_metrics, False, False, 512)
cells["test_metrics test_gather_for_metrics_drop_last"] = (test_metrics.test_gather_for_metrics_drop_last,)

# test_ops.py checks Accelerate's free functions (accelerate.utils.operations) on its PartialState; the ones the
# Accelerator offers as methods run with the runner's Accelerator as the state and its methods in their place.
import test_ops
test_ops.gather, test_ops.pad_across_processes, test_ops.reduce = (
    accelerator.gather, accelerator.pad_across_processes, accelerator.reduce)
for name in ("test_gather", "test_gather_non_contiguous", "test_pad_across_processes", "test_reduce_sum",
             "test_reduce_mean", "test_reduce_max"):
    cells[f"test_ops {name}"] = (getattr(test_ops, name), accelerator)

# test_sync.py: the gradient accumulation checks its main() runs on multi-GPU only, for each split_batches,
# dispatch_batches and sync_each_batch, with and without optimizer and scheduler (main() runs the all-False one
# with them on every device: test_accelerates_test_sync_passes).
if accelerator.num_processes == 2:
    import test_sync
    for split in (True, False):
        for dispatch in (True, False):
            for each in (True, False):
                options = f"{split=} {dispatch=} {each=}"
                cells[f"test_sync test_gradient_accumulation {options}"] = (
                    test_sync.test_gradient_accumulation, split, dispatch, each)
                if split or dispatch or each:
                    cells[f"test_sync test_gradient_accumulation_with_opt_and_scheduler {options}"] = (
                        test_sync.test_gradient_accumulation_with_opt_and_scheduler, split, dispatch, each)

for name, (cell, *arguments) in cells.items():
    try:
        cell(*arguments)
        result = "PASS"
    except BaseException as err:
        result = f"FAIL {type(err).__name__}: {err}"
    if accelerator.process_index == 0:
        print(f"CELL {name}: {result}", flush=True)
"""
# The cells each script has in the harness, by process count.
CELL_COUNTS = {1: {"test_script": 4, "test_metrics": 6, "test_ops": 6},
               2: {"test_script": 4, "test_metrics": 6, "test_ops": 6, "test_sync": 15}}
# Checks those scripts' main() runs on a CPU that build an Accelerator but are left out, and why:
CELLS_LEFT_OUT = {
    "test_script.py": {
        "training_check": "sizes its data from AcceleratorState().num_processes, Accelerate's own singleton (1 here)",
        "check_seedable_sampler_in_batch_sampler_shard": "inspects what accelerate.data_loader.prepare_data_loader "
                                                         "made",
        "test_reinstantiated_state": "resets Accelerate's AcceleratorState singleton",
    },
    "test_ops.py": {
        "test_broadcast": "a free function of accelerate.utils.operations with no Accelerator method",
        "test_gather_object": "(the same)",
        "test_op_checker": "Accelerate's debug mode (ACCELERATE_DEBUG_MODE) checking shapes before a collective; "
                           "the runner has none",
        "test_copy_tensor_to_devices": "runs on GPUs and XLA only",
    },
}


@pytest.mark.parametrize("processes", [1, 2])
def test_accelerates_script_cells_pass(tmp_path, processes):
    """test_script: process execution and its decorators, the seedable sampler (with and without data_seed), the
    breakpoint trigger. test_metrics: gather_for_metrics drops the samples that made the shards even (99 of 99,
    512 of 512), with and without split_batches, each process reading its shard or the main process dispatching,
    and a drop_last loader gathers whole batches. test_ops: gather (also non-contiguous), pad_across_processes,
    reduce sum, mean and max (checked on 2 processes, as the script checks them). test_sync, on 2 processes:
    accumulate() syncs every num_steps batches and at the loader's end (or every batch with sync_each_batch),
    whole or split batches, read by every process or dispatched."""
    for script in ("test_script.py", "external_deps/test_metrics.py", "test_ops.py", "test_sync.py"):
        text = swapped(script, tmp_path).read_text(encoding="utf-8")
        missing = [name for name in CELLS_LEFT_OUT.get(script, {}) if f"def {name}(" not in text]
        assert not missing, f"{script} no longer has {missing}: update CELLS_LEFT_OUT"
    harness = tmp_path / "cells.py"
    harness.write_text(CELLS, encoding="utf-8")
    result = run(harness, processes)
    cells = [line.split("CELL ", 1)[1] for line in (result.stdout + result.stderr).splitlines() if "CELL " in line]
    counts = {}
    for cell in cells:
        counts[cell.split()[0]] = counts.get(cell.split()[0], 0) + 1
    assert counts == CELL_COUNTS[processes], result.stdout[-3000:] + result.stderr[-3000:]
    assert all(cell.endswith(": PASS") for cell in cells), [cell for cell in cells if not cell.endswith(": PASS")]
