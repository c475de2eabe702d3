"""Where metrics go: sinks behind one small interface, chosen in the config group `logger` (a list).

    logger=[tensorboard,csv]       # conf/logger/*.yaml; each file fills `logger.<name>` with a `_partial_` target

Every sink gets the step's scalars (`log`), the resolved config once (`log_config`), the flattened config with the
final metrics (`log_final`) and `close`. metrics.jsonl is the run's own record (result.json, the sweep report and
resume read it): it is always written unless `logging.jsonl=false`, whatever the list says. Sinks exist on the main
process only (`make_logger` decides once); other processes get a `NullLogger`.

A sink of your own is a class with these four methods; name it with `+logger.mine._target_=mylab.MySink` and
`+logger.mine._partial_=true` (it is called with `run_dir`, `start_step` and `run`, a `RunInfo`).
"""

from __future__ import annotations

import csv
import json
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from runner.errors import ConfigError, Problem, WriteError, write_failure
from runner.ground import flatten_hparams, install_hint
from runner.training.metrics import _drop_rows_after


@dataclass(frozen=True)
class RunInfo:
    """What names a run in a tracker: `logging.name`, `logging.tags`, `logging.notes`."""

    name: str | None = None
    tags: tuple[str, ...] = ()
    notes: str | None = None


class _FileSink:
    """A write that fails (a full disk) raises WriteError naming the file; close() after that says nothing."""

    def __init__(self, run_dir: Path, name: str):
        self._path, self._name, self._failed = run_dir / name, name, False

    def _writing(self, what: str) -> "_SinkWriting":
        return _SinkWriting(self, what)

    @contextmanager
    def _closing(self) -> Iterator[None]:
        failed_before = self._failed
        try:
            with self._writing(self._name):
                yield
        except WriteError:
            if not failed_before:
                raise


class _SinkWriting(write_failure):
    """write_failure that also marks its sink failed, so that its close() says nothing more."""

    def __init__(self, sink: _FileSink, what: str):
        super().__init__(sink._path, what)
        self.sink = sink

    def __exit__(self, kind, err, traceback) -> bool:
        self.sink._failed |= isinstance(err, WriteError)  # a nested write's, already naming its file
        try:
            return super().__exit__(kind, err, traceback)
        except WriteError:
            self.sink._failed = True
            raise


class TensorBoardSink(_FileSink):
    """Scalars into `<run dir>/tensorboard`; the config as text; hparams (flattened config + final metrics) for
    the HParams tab; the run's name, tags and notes as text under `run`."""

    def __init__(self, run_dir: Path, start_step: int = 0, run: RunInfo = RunInfo()):
        from torch.utils.tensorboard import SummaryWriter

        super().__init__(run_dir, "tensorboard")
        # A resumed run drops what an interrupted one logged after its checkpoint (purge_step): no step twice.
        resumed = (run_dir / "tensorboard").is_dir()
        with self._writing("the TensorBoard event file"):  # it writes its first event at once: a full disk fails here
            self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), max_queue=self.HAND_OVER_EVENTS,
                                         purge_step=start_step + 1 if resumed else None)
        self._run = run
        self._pending: list = []  # (step, wall time, scalars) logged but not yet handed to the writer, oldest first
        self._handed_at = 0.0  # time.monotonic() of the last hand-over

    def log(self, step: int, metrics: dict[str, float]) -> None:
        # The event is built at the hand-over, with the others pending: ~40 us less a log inside a training loop.
        self._pending.append((step, time.time(), {name: float(value) for name, value in metrics.items()}))
        # Each hand-over wakes the writer thread, which then trades the GIL with the training loop: ~10 futex
        # calls an event. Events logged in quick succession go over together, as many as the writer's queue
        # holds, none waiting longer than HAND_OVER_SECONDS; slower logging hands each over as it comes. On the
        # tiny benchmark (0.3 ms steps, a log every 10) batches of 10 took 217 futex calls a 200-step run down to
        # 31, and ~19 us of CPU a step.
        if len(self._pending) >= self.HAND_OVER_EVENTS or time.monotonic() - self._handed_at >= self.HAND_OVER_SECONDS:
            self._hand_over()

    HAND_OVER_EVENTS = 100  # also the writer's max_queue: a hand-over never waits for room in the queue
    HAND_OVER_SECONDS = 1.0

    def flush(self) -> None:
        """Hand every event logged so far to the writer (before a checkpoint: a run killed after it resumes from
        it, logging only the steps after)."""
        self._hand_over()

    def _hand_over(self) -> None:
        """Give the writer every pending event, with the step and wall time it was logged at."""
        if not self._pending:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        pending, self._pending, self._handed_at = self._pending, [], time.monotonic()
        with self._writing(f"TensorBoard events up to step {pending[-1][0]}"):
            for step, wall_time, metrics in pending:
                # One event holding all of the step's scalars, not one event each: without TensorFlow, TensorBoard
                # checksums every event in pure Python on its writer thread, ~80 us of CPU per event.
                values = [Summary.Value(tag=name, simple_value=value) for name, value in metrics.items()]
                event = Event(summary=Summary(value=values), step=step, wall_time=wall_time)
                self._writer.file_writer.add_event(event, step, wall_time)

    def log_config(self, config: dict[str, Any]) -> None:
        self._hand_over()
        self._writer.add_text("config", "```\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)
        lines = [f"**{self._run.name}**" if self._run.name else "",
                 f"tags: {', '.join(self._run.tags)}" if self._run.tags else "", self._run.notes or ""]
        if any(lines):
            self._writer.add_text("run", "\n\n".join(line for line in lines if line), 0)

    def log_final(self, config: dict[str, Any], final_metrics: dict[str, float]) -> None:
        self._hand_over()
        metrics = {f"hparam/{name}": value for name, value in final_metrics.items()}
        # run_name="." keeps them in this run's event file instead of a new timestamped subdirectory.
        self._writer.add_hparams(flatten_hparams(config), metrics, run_name=".")

    def close(self) -> None:
        with self._closing():
            self._hand_over()
            self._writer.close()


class JsonlSink(_FileSink):
    """One JSON object per logged step in `<run dir>/metrics.jsonl` (the config is config.yaml, the final metrics
    go to result.json)."""

    def __init__(self, run_dir: Path, start_step: int = 0, run: RunInfo = RunInfo()):
        super().__init__(run_dir, "metrics.jsonl")
        path = run_dir / "metrics.jsonl"
        with write_failure(path, "metrics.jsonl"):
            _drop_rows_after(path, start_step)
            self._file = open(path, "a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with self._writing(f"metrics.jsonl at step {step}"):  # each row as it is logged: runs are followed live
            self._file.write(json.dumps({"step": step, **metrics}) + "\n")
            self._file.flush()

    def log_config(self, config: dict[str, Any]) -> None:
        pass

    def log_final(self, config: dict[str, Any], final_metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        with self._closing():
            self._file.close()


class CsvSink(_FileSink):
    """`<run dir>/csv/metrics.csv`: one row per step, a `step` column and one column per metric (a metric not
    logged at a step is an empty cell; a new metric rewrites the file with the wider header); `csv/hparams.csv`: `key,value` rows of the
    flattened config, then `final/<metric>` rows."""

    def __init__(self, run_dir: Path, start_step: int = 0, run: RunInfo = RunInfo()):
        super().__init__(run_dir, "csv")
        self._dir = run_dir / "csv"
        self._path = self._dir / "metrics.csv"
        self._rows: list[dict[str, Any]] = []
        self._columns: list[str] = ["step"]
        with self._writing("csv/metrics.csv"):
            self._dir.mkdir(exist_ok=True)
            if self._path.is_file():  # a resumed run: keep the rows up to its checkpoint's step
                with open(self._path, newline="", encoding="utf-8") as file:
                    reader = csv.DictReader(file)
                    self._columns = list(reader.fieldnames or ["step"])
                    self._rows = [row for row in reader if row.get("step") and int(row["step"]) <= start_step]
                self._rewrite()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with self._writing(f"csv/metrics.csv at step {step}"):
            # One row per step: an evaluation logged after the step's training line joins that line's row.
            same_step = bool(self._rows) and int(self._rows[-1]["step"]) == step
            if same_step:
                self._rows[-1].update(metrics)
            else:
                self._rows.append({"step": step, **metrics})
            new = [name for name in metrics if name not in self._columns]
            self._columns += new
            if new or same_step:
                self._rewrite()
            else:
                with open(self._path, "a", newline="", encoding="utf-8") as file:
                    csv.DictWriter(file, self._columns).writerow(self._rows[-1])

    def _rewrite(self) -> None:
        partial = self._path.with_name(".partial-metrics.csv")
        with open(partial, "w", newline="", encoding="utf-8") as file:
            writer = csv.DictWriter(file, self._columns)
            writer.writeheader()
            writer.writerows(self._rows)
        partial.replace(self._path)

    def log_config(self, config: dict[str, Any]) -> None:
        pass  # hparams.csv, with the final metrics, at the end

    def log_final(self, config: dict[str, Any], final_metrics: dict[str, float]) -> None:
        path = self._dir / "hparams.csv"
        with self._writing("csv/hparams.csv"), open(path, "w", newline="", encoding="utf-8") as file:
            writer = csv.writer(file)
            writer.writerow(["key", "value"])
            writer.writerows(flatten_hparams(config).items())
            writer.writerows((f"final/{name}", value) for name, value in final_metrics.items())

    def close(self) -> None:
        pass  # every write above opens and closes its file


class NullLogger:
    """What processes other than the main one log to: nothing."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def flush(self) -> None:
        pass

    def log_config(self, config: dict[str, Any]) -> None:
        pass

    def log_final(self, config: dict[str, Any], final_metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


EVALUATION_PREFIX = "val/"


class LogSink(NullLogger):
    """Each logged step as one line of the run's log (what a debug run, trainer.fast_dev_run, logs to)."""

    def __init__(self, run_dir: Path | None = None, start_step: int = 0, run: RunInfo = RunInfo()):
        import logging

        self._log = logging.getLogger("runner.training.metrics")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        # The loop logs its own evaluation (`val/...`) itself, once; a callback's (`val_ema/...`) only comes here.
        shown = {name: value for name, value in metrics.items() if not name.startswith(EVALUATION_PREFIX)}
        if shown:
            self._log.info("step %d: %s", step, ", ".join(f"{name}={value:.4g}" for name, value in shown.items()))


# The optional sinks and the package (and runner extra) each needs, checked in the parent before any worker starts.
EXTRAS = {"WandbSink": "wandb", "MlflowSink": "mlflow"}
# Recipes write the public name (runner.loggers.X), which forwards to this module's.
SINK_MODULES = ("runner.loggers", "runner.training.loggers")


def extra_problems(sinks: dict[str, Any]) -> list[Problem]:
    """A chosen sink whose package is not installed, as the problem `make_logger` would raise later."""
    import importlib.util

    problems = []
    for name, node in sinks.items():
        module, _, sink_class = str((node or {}).get("_target_")).rpartition(".")
        package = EXTRAS.get(sink_class) if module in SINK_MODULES else None
        if package and importlib.util.find_spec(package) is None:
            problems += _missing_extra(name, package).problems
    return problems


def _missing_extra(sink: str, package: str) -> ConfigError:
    """Each optional sink's extra is named after its package."""
    return ConfigError(f"logger.{sink}", f"needs the {package} package, which is not installed; install it with "
                                         f"{install_hint(package)}, or leave {sink} out of logger=[...]")


class WandbSink:
    """Weights & Biases: `wandb.init(project, entity, name, tags, notes, config=<flattened config>, dir=<run dir>,
    mode)`; scalars with their step; the final metrics into the run summary. `mode: offline` writes
    `<run dir>/wandb/` for `wandb sync` later."""

    def __init__(self, run_dir: Path, start_step: int = 0, run: RunInfo = RunInfo(), *, project: str = "runner",
                 entity: str | None = None, mode: str | None = None, group: str | None = None):
        try:
            import wandb
        except ImportError:
            raise _missing_extra("wandb", "wandb") from None
        self._run = wandb.init(project=project, entity=entity, name=run.name, tags=list(run.tags) or None,
                               notes=run.notes, group=group, dir=str(run_dir), mode=mode, resume="allow",
                               id=_tracker_id(run_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def log_config(self, config: dict[str, Any]) -> None:
        self._run.config.update(flatten_hparams(config), allow_val_change=True)

    def log_final(self, config: dict[str, Any], final_metrics: dict[str, float]) -> None:
        self._run.summary.update({f"final/{name}": value for name, value in final_metrics.items()})

    def close(self) -> None:
        self._run.finish()


class MlflowSink:
    """MLflow: a run named `logging.name` with the tags (and the notes as its description); the flattened config as
    params; scalars with their step; the final metrics as `final/<name>`. `tracking_uri: null` keeps a file store
    in `<run dir>/mlruns` (`mlflow ui --backend-store-uri <run dir>/mlruns`)."""

    def __init__(self, run_dir: Path, start_step: int = 0, run: RunInfo = RunInfo(), *,
                 tracking_uri: str | None = None, experiment: str = "runner"):
        try:
            import mlflow
        except ImportError:
            raise _missing_extra("mlflow", "mlflow") from None
        self._mlflow = mlflow
        mlflow.set_tracking_uri(tracking_uri or (run_dir / "mlruns").resolve().as_uri())
        mlflow.set_experiment(experiment)
        tags = {tag: "" for tag in run.tags}
        if run.notes:
            tags["mlflow.note.content"] = run.notes
        self._run = mlflow.start_run(run_name=run.name, tags=tags)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._mlflow.log_metrics(dict(metrics), step=step)

    def log_config(self, config: dict[str, Any]) -> None:
        params = {name: str(value)[:500] for name, value in flatten_hparams(config).items()}
        self._mlflow.log_params(params)

    def log_final(self, config: dict[str, Any], final_metrics: dict[str, float]) -> None:
        self._mlflow.log_metrics({f"final/{name}": value for name, value in final_metrics.items()})

    def close(self) -> None:
        self._mlflow.end_run()


def _tracker_id(run_dir: Path) -> str:
    """One tracker run per run dir: a resumed run continues the same W&B run instead of starting a second."""
    import hashlib

    return hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]


@dataclass
class Loggers:
    """Every sink of the main process, called in turn."""

    sinks: list = field(default_factory=list)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def log_config(self, config: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log_config(config)

    def log_final(self, config: dict[str, Any], final_metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log_final(config, final_metrics)

    def flush(self) -> None:
        """Every sink that holds logged metrics back (TensorBoardSink) hands them on now."""
        for sink in self.sinks:
            flush = getattr(sink, "flush", None)  # optional: a sink of your own needs only the four methods
            if flush is not None:
                flush()

    def close(self) -> None:
        """Close every sink, even after one failed; the first failure is raised."""
        first = None
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as err:  # noqa: BLE001 -- re-raised below, after the others closed
                first = first or err
        if first is not None:
            raise first


def make_logger(run_dir: Path, is_main: bool, sinks: dict[str, Any], jsonl: bool = True, start_step: int = 0,
                run: RunInfo = RunInfo()) -> Loggers | NullLogger:
    """The main process's sinks: metrics.jsonl (unless jsonl is false) and each `logger.<name>` node, built through
    runner.config.instantiate (the allow-list checked in the parent); every other process logs nowhere."""
    if not is_main:
        return NullLogger()
    from runner.config.instantiate import call_built, instantiate

    built: list = [JsonlSink(run_dir, start_step, run)] if jsonl else []
    try:
        for name, node in sinks.items():
            factory = instantiate(f"logger.{name}", node)
            built.append(call_built(f"logger.{name}", node, factory, run_dir, start_step=start_step, run=run))
    except BaseException:
        # The sinks built so far hold open files and writer threads: in a sweep's next job they would still be
        # there. The build failure is the error to report, not one of theirs while closing.
        with suppress(Exception):
            Loggers(built).close()
        raise
    return Loggers(built)
