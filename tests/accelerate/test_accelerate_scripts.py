"""HuggingFace Accelerate's own test scripts (accelerate/test_utils/scripts, from the installed Accelerate) run with
only `from accelerate... import Accelerator` swapped for `from runner import Accelerator`, on 1 and 2 CPU processes
(`python -m runner.launch` starts the two, as `accelerate launch` would). Each must exit 0 having run its checks.

A check the runner leaves out by design is replaced by `pass` here and listed in LEFT_OUT with why (the docs'
Accelerate table says the same): those reach into Accelerate's internals or need what the runner refuses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

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
    """The installed script with the runner's Accelerator imported, and the LEFT_OUT lines replaced by `pass`."""
    text = (SCRIPTS / script).read_text(encoding="utf-8")
    names = [line for line in text.splitlines() if line.startswith(IMPORTS)]
    assert len(names) == 1, f"{script}: expected one import of Accelerator, found {names}"
    text = text.replace(names[0], names[0].replace("from accelerate.accelerator import", "from runner import")
                        .replace("from accelerate import Accelerator", "from runner import Accelerator"))
    for line, why in LEFT_OUT.get(script, {}).items():
        assert f"\n{line}\n" in text, f"{script} no longer has {line.strip()!r}: update LEFT_OUT"
        text = text.replace(f"\n{line}\n", f"\n{line[:len(line) - len(line.lstrip())]}pass  # left out: {why}\n")
    path = directory / Path(script).name
    path.write_text(text, encoding="utf-8")
    return path


def run(script: Path, processes: int) -> subprocess.CompletedProcess:
    launch = [] if processes == 1 else ["-m", "runner.launch", "hardware=multi_cpu",
                                        f"hardware.num_processes={processes}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *launch, str(script)], cwd=script.parent, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("processes", [1, 2])
def test_accelerates_test_sync_passes(tmp_path, processes):
    """no_sync, accumulate with a loader break, gradient accumulation with optimizer and scheduler."""
    result = run(swapped("test_sync.py", tmp_path), processes)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ran = "Test Distributed `no_sync` context manager" if processes == 2 else "Test NOOP `no_sync` context manager"
    assert ran in result.stdout and "gradient accumulation with optimizer and scheduler" in result.stdout


# test_sync.py's main() checks gradient accumulation for each split_batches, dispatch_batches and sync_each_batch
# (with and without an optimizer and scheduler) on multi-GPU only. They run here on 2 CPU processes, each on its
# own. (Accelerate's own Accelerator fails 4 of them on a CPU: measured with torch 2.13 and Accelerate 1.16.)
SYNC_CELLS = """
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_sync as s
from runner import Accelerator

accelerator = Accelerator()
cells = {}
for split in (True, False):
    for dispatch in (True, False):
        for each in (True, False):
            options = f"split_batches={split} dispatch_batches={dispatch} sync_each_batch={each}"
            cells[f"test_gradient_accumulation {options}"] = (s.test_gradient_accumulation, split, dispatch, each)
            if split or dispatch or each:  # (main() runs the all-False one on every device)
                cells[f"test_gradient_accumulation_with_opt_and_scheduler {options}"] = (
                    s.test_gradient_accumulation_with_opt_and_scheduler, split, dispatch, each)
for name, (cell, *options) in cells.items():
    try:
        cell(*options)
        result = "PASS"
    except BaseException as err:
        result = f"FAIL {type(err).__name__}: {err}"
    if accelerator.process_index == 0:
        print(f"CELL {name}: {result}", flush=True)
"""


def test_accelerates_multi_gpu_accumulation_cells_pass_on_cpus(tmp_path):
    """accumulate() syncs every num_steps batches and at the loader's end (or every batch with sync_each_batch),
    whole or split batches, read by every process or dispatched from the main one."""
    swapped("test_sync.py", tmp_path)
    harness = tmp_path / "cells.py"
    harness.write_text(SYNC_CELLS, encoding="utf-8")
    result = run(harness, 2)
    cells = [line.split("CELL ", 1)[1] for line in (result.stdout + result.stderr).splitlines() if "CELL " in line]
    assert len(cells) == 15, result.stdout[-3000:] + result.stderr[-3000:]
    assert all(cell.endswith(": PASS") for cell in cells), cells


def test_accelerates_test_distributed_data_loop_passes(tmp_path):
    """even_batches, join_uneven_inputs and its overrides, and every DataLoader kind, on 2 processes (the script
    asserts it has 2)."""
    result = run(swapped("test_distributed_data_loop.py", tmp_path), 2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for check in ("Test joining uneven inputs", "Test overriding even_batches raises a warning for iterable",
                  "Test DataLoader with sampler as an instance of `BatchSampler`"):
        assert check in result.stdout + result.stderr, check


# test_script.py's main() runs these checks in turn. Only four of them build an Accelerator; the others call
# Accelerate's own AcceleratorState, PartialState or prepare_data_loader, so they test Accelerate, not the runner,
# whatever Accelerator the script imports. The four run here each on its own, their results printed, so that one
# failing check does not hide the others.
SCRIPT_CELLS = """
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_script as s
from runner import Accelerator

accelerator = Accelerator()
cells = {
    "process_execution_check": s.process_execution_check,
    "check_seedable_sampler": s.check_seedable_sampler,
    "check_seedable_sampler_with_data_seed": s.check_seedable_sampler_with_data_seed,
    "test_trigger": s.test_trigger,
}
for name, cell in cells.items():
    try:
        cell()
        result = "PASS"
    except BaseException as err:
        result = f"FAIL {type(err).__name__}: {err}"
    if accelerator.process_index == 0:
        print(f"CELL {name}: {result}", flush=True)
"""
# test_script.py's checks that build an Accelerator but are left out, and why:
SCRIPT_LEFT_OUT = {
    "training_check": "sizes its data from AcceleratorState().num_processes, Accelerate's own singleton (1 here)",
    "check_seedable_sampler_in_batch_sampler_shard": "inspects what accelerate.data_loader.prepare_data_loader made",
    "test_reinstantiated_state": "resets Accelerate's AcceleratorState singleton",
}


@pytest.mark.parametrize("processes", [1, 2])
def test_accelerates_test_script_cells_pass(tmp_path, processes):
    """The checks of test_script.py that exercise the Accelerator: process execution and its decorators, the
    seedable sampler (with and without data_seed), the breakpoint trigger."""
    script = swapped("test_script.py", tmp_path).read_text(encoding="utf-8")
    assert all(f"def {name}(" in script for name in SCRIPT_LEFT_OUT), "test_script.py changed: update SCRIPT_LEFT_OUT"
    harness = tmp_path / "cells.py"
    harness.write_text(SCRIPT_CELLS, encoding="utf-8")
    result = run(harness, processes)
    cells = [line.split("CELL ", 1)[1] for line in (result.stdout + result.stderr).splitlines() if "CELL " in line]
    assert len(cells) == 4, result.stdout[-3000:] + result.stderr[-3000:]
    assert all(cell.endswith(": PASS") for cell in cells), cells


# external_deps/test_metrics.py's main() on a CPU: test_torch_metrics for each split_batches and dispatch_batches
# (99 samples), again with 512 (the last batch not dropped when it divides evenly), and
# test_gather_for_metrics_drop_last; each built on its own Accelerator, as main() builds them. (main() leaves out
# test_mrpc and the iterable-dataset cells on a CPU: it runs them only on a GPU, and test_mrpc needs `evaluate`.)
METRICS_CELLS = """
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_metrics as m
from runner import Accelerator, DataLoaderConfiguration

def torch_metrics(split_batches, dispatch_batches, length):
    config = DataLoaderConfiguration(split_batches=split_batches, dispatch_batches=dispatch_batches)
    return lambda: m.test_torch_metrics(Accelerator(dataloader_config=config), length)

cells = {f"test_torch_metrics split_batches={split} dispatch_batches={dispatch} length=99":
         torch_metrics(split, dispatch, 99) for split in (True, False) for dispatch in (True, False)}
cells["test_torch_metrics length=512"] = torch_metrics(False, False, 512)
cells["test_gather_for_metrics_drop_last"] = m.test_gather_for_metrics_drop_last
for name, cell in cells.items():
    try:
        cell()
        result = "PASS"
    except BaseException as err:
        result = f"FAIL {type(err).__name__}: {err}"
    if Accelerator().process_index == 0:
        print(f"CELL {name}: {result}", flush=True)
"""


@pytest.mark.parametrize("processes", [1, 2])
def test_accelerates_test_metrics_cells_pass(tmp_path, processes):
    """gather_for_metrics drops the samples that made the shards even (99 of 99 gathered, 512 of 512), with and
    without split_batches, each process reading its shard or the main process dispatching the batches, and a
    drop_last loader gathers whole batches."""
    swapped("external_deps/test_metrics.py", tmp_path)
    harness = tmp_path / "cells.py"
    harness.write_text(METRICS_CELLS, encoding="utf-8")
    result = run(harness, processes)
    cells = [line.split("CELL ", 1)[1] for line in (result.stdout + result.stderr).splitlines() if "CELL " in line]
    assert len(cells) == 6, result.stdout[-3000:] + result.stderr[-3000:]
    assert all(cell.endswith(": PASS") for cell in cells), cells


# test_ops.py checks Accelerate's free functions (accelerate.utils.operations) on Accelerate's PartialState. The
# ones the Accelerator also offers as methods (gather, pad_across_processes, reduce) run here with the runner's
# Accelerator as `state` and its methods in place of those functions; the checks themselves are unchanged.
OPS_CELLS = """
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_ops as ops
from runner import Accelerator

accelerator = Accelerator(cpu=True)
ops.gather, ops.pad_across_processes, ops.reduce = (accelerator.gather, accelerator.pad_across_processes,
                                                    accelerator.reduce)
cells = {name: getattr(ops, name) for name in ("test_gather", "test_gather_non_contiguous",
                                               "test_pad_across_processes", "test_reduce_sum", "test_reduce_mean",
                                               "test_reduce_max")}
for name, cell in cells.items():
    try:
        cell(accelerator)
        result = "PASS"
    except BaseException as err:
        result = f"FAIL {type(err).__name__}: {err}"
    if accelerator.process_index == 0:
        print(f"CELL {name}: {result}", flush=True)
"""
# test_ops.py's checks left out, and why:
OPS_LEFT_OUT = {
    "test_broadcast, test_gather_object": "Accelerate's free functions, with no Accelerator method to stand for them",
    "test_op_checker": "Accelerate's debug mode (ACCELERATE_DEBUG_MODE) checking shapes before a collective; the "
                       "runner has no such mode",
    "test_copy_tensor_to_devices": "runs on GPUs and XLA only",
}


@pytest.mark.parametrize("processes", [1, 2])
def test_accelerates_test_ops_cells_pass(tmp_path, processes):
    """gather (also of a non-contiguous tensor), pad_across_processes and reduce (sum, mean, max: checked on 2
    processes, as the script checks them) through the runner's Accelerator."""
    script = (SCRIPTS / "test_ops.py").read_text(encoding="utf-8")
    assert all(f"def {name}(" in script for names in OPS_LEFT_OUT for name in names.split(", ")), \
        "test_ops.py changed: update OPS_LEFT_OUT"
    (tmp_path / "test_ops.py").write_text(script, encoding="utf-8")
    harness = tmp_path / "cells.py"
    harness.write_text(OPS_CELLS, encoding="utf-8")
    result = run(harness, processes)
    cells = [line.split("CELL ", 1)[1] for line in (result.stdout + result.stderr).splitlines() if "CELL " in line]
    assert len(cells) == 6, result.stdout[-3000:] + result.stderr[-3000:]
    assert all(cell.endswith(": PASS") for cell in cells), cells
