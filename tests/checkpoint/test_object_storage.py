"""Checkpoints on object storage (`checkpoint.dir=s3://...`, runner/checkpoint/remote.py) against a real S3 API:
moto's server on 127.0.0.1, started here, with credentials enforced (an IAM user and key made at start). Commit by
manifest, retention, exports, fetch-and-verify on resume, an upload killed midway, a tampered object, a bad
credential, a missing bucket, the sharded (DCP) layout, and an exact resume on a machine without the run dir."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from checkpoint_helpers import RESOLVED, trained_objects
from conftest import ROOT, free_port, read_jsonl, read_scalars, wait_for
from resume_helpers import HELPERS_ENV, RUN, kill_everything, run_cli, start
from runner.checkpoint import files, find_resume
from runner.checkpoint.remote import Storage
from runner.config import CheckpointConfig, MonitorMode
from runner.errors import CheckpointError, ConfigError
from runner.training.checkpointer import MODEL_FILE, Checkpointer, restore

pytest.importorskip("s3fs", reason="the test extra installs s3fs and moto[server]")
pytest.importorskip("moto.server", reason="the test extra installs s3fs and moto[server]")

BUCKET = "ckpt"
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # DCP without a group


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on a free port, checking credentials after its first 4 requests (which make an IAM user
    allowed everything, its key, and the bucket). Yields the environment a client needs: key and endpoint."""
    import boto3

    log = tmp_path_factory.mktemp("moto") / "moto.log"
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4"}
    with log.open("wb") as output:  # moto logs every request: a pipe nobody reads would fill and stop it
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  env=env, stdout=output, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(endpoint) or server.poll() is not None, "moto's server to answer")
        assert server.poll() is None, log.read_text()
        setup = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup",
                     aws_secret_access_key="setup")
        iam = boto3.session.Session().client("iam", **setup)
        iam.create_user(UserName="runner")
        iam.put_user_policy(UserName="runner", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="runner")["AccessKey"]
        boto3.session.Session().client("s3", **setup).create_bucket(Bucket=BUCKET)
        yield {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
               "AWS_ENDPOINT_URL": endpoint, "AWS_CONFIG_FILE": "/nonexistent",
               "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"}
    finally:
        server.terminate()
        server.wait(timeout=30)


def _answers(endpoint: str) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
        return True
    except OSError:
        return False


def client(service: str, aws: dict):
    """A boto3 client with these credentials and endpoint. Not boto3.client(): its default session keeps the
    credentials of its first use in this process, which another test may have made with other ones."""
    import boto3

    return boto3.session.Session().client(
        service, region_name="us-east-1", endpoint_url=aws["AWS_ENDPOINT_URL"],
        aws_access_key_id=aws["AWS_ACCESS_KEY_ID"], aws_secret_access_key=aws["AWS_SECRET_ACCESS_KEY"])


@pytest.fixture
def aws(s3, monkeypatch):
    """The credentials and endpoint in this process's environment, as a user sets them."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3.items():
        monkeypatch.setenv(name, value)
    return s3


def checkpointer(run_dir: Path, url: str, layout=files.Layout.safetensors, **settings) -> Checkpointer:
    return Checkpointer(run_dir, CheckpointConfig(dir=url, **settings), writer=True, monitor="val/accuracy",
                        monitor_mode=MonitorMode.max, world_size=1, resolved=RESOLVED, layout=layout)


def save(saver: Checkpointer, model, optimizer, step: int, accuracy: float | None = None, final: bool = False):
    position = {"step": step, "epoch": 0, "batch_in_epoch": step, "samples_in_epoch": step * 8, "global_batch": 8}
    state = {"loop": {"step": step}}
    if saver.layout is files.Layout.safetensors:
        state["optimizer"] = optimizer.state_dict()
    saver.save(model, state, position, {} if accuracy is None else {"val/accuracy": accuracy}, final=final,
               optimizer=optimizer if saver.layout is files.Layout.dcp else None)
    saver.wait()


def objects(prefix: str) -> set[str]:
    """Every object under s3://ckpt/<prefix>, relative to it."""
    storage = Storage(f"s3://{BUCKET}/{prefix}")
    return {path[len(storage.root) + 1:] for path in storage.fs.find(storage.root)}


def test_commit_retention_and_exports_in_the_bucket(aws, tmp_path):
    """Each checkpoint is committed with its manifest last, retention keeps the same ones as on disk, and the
    exports are there too, byte for byte."""
    model, optimizer = trained_objects()
    saver = checkpointer(tmp_path, f"s3://{BUCKET}/retention", keep_last=2, keep_best=1)
    for step, accuracy in [(1, 0.2), (2, 0.9), (3, 0.5), (4, 0.4)]:
        save(saver, model, optimizer, step, accuracy, final=step == 4)
    stored = Storage(f"s3://{BUCKET}/retention")
    assert [name for name, _ in stored.committed()] == ["step_00000002", "step_00000003", "step_00000004"]
    assert [path.name for path, _ in files.complete_checkpoints(tmp_path / "checkpoints")] == \
        [name for name, _ in stored.committed()]
    names = objects("retention")
    assert {f"checkpoints/step_00000004/{name}" for name in ("model.safetensors", "state.pt", "config.yaml",
                                                              "manifest.json")} <= names
    assert not any(name.startswith("checkpoints/step_00000001") for name in names)  # retired, manifest and all
    for name in ("final.safetensors", "final.json", "best.safetensors", "best.json", "config.yaml"):
        assert stored.fs.cat_file(stored.path("export", name)) == (tmp_path / "export" / name).read_bytes(), name
    assert json.loads(stored.fs.cat_file(stored.path("export", "best.json")))["step"] == 2


def test_fetch_verifies_and_a_tampered_object_falls_back(aws, tmp_path, caplog):
    """resume=auto on a machine without the run dir fetches the newest committed checkpoint and verifies every
    sha256; a newest one altered in the bucket (same size) is reported and the previous one taken."""
    model, optimizer = trained_objects()
    url = f"s3://{BUCKET}/tampered"
    saver = checkpointer(tmp_path / "first", url, keep_last=None)
    for step in (1, 2, 3):
        save(saver, model, optimizer, step)
    stored = Storage(url)
    stored.fs.rm(stored.path("checkpoints", "step_00000003", "state.pt"))  # deleted from the bucket since
    weights = stored.path("checkpoints", "step_00000002", MODEL_FILE)
    data = bytearray(stored.fs.cat_file(weights))
    data[-1] ^= 0xFF
    stored.fs.pipe(weights, bytes(data))

    elsewhere = tmp_path / "elsewhere"
    chosen = find_resume("auto", elsewhere, storage=Storage(url))
    assert chosen == elsewhere / "checkpoints" / "step_00000001"
    assert "step_00000003 is damaged: it could not be downloaded (FileNotFoundError" in caplog.text
    assert "step_00000002 is damaged" in caplog.text and "does not match its sha256" in caplog.text
    assert not (elsewhere / "checkpoints" / "step_00000002").exists()  # the damaged download is not kept
    fresh, fresh_optimizer = trained_objects(seed=1)
    restore(chosen, fresh, fresh_optimizer)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    with pytest.raises(ConfigError, match=r"checkpoint.dir: is s3://ckpt/tampered, which already holds the "
                                          r"checkpoints of a run; continue it with resume=auto"):
        find_resume(None, tmp_path / "fresh", storage=Storage(url))


def test_a_manifest_naming_a_path_outside_the_checkpoint_is_refused(aws, tmp_path):
    model, optimizer = trained_objects()
    url = f"s3://{BUCKET}/escape"
    save(checkpointer(tmp_path / "run", url), model, optimizer, 1)
    stored = Storage(url)
    manifest_path = stored.path("checkpoints", "step_00000001", files.MANIFEST)
    manifest = json.loads(stored.fs.cat_file(manifest_path))
    manifest["files"]["../../outside"] = {"size": 1, "sha256": []}
    stored.fs.pipe(manifest_path, json.dumps(manifest).encode())
    with pytest.raises(CheckpointError, match=r"names '../../outside', which is not a checkpoint file"):
        find_resume("auto", tmp_path / "elsewhere", storage=stored)
    assert not (tmp_path / "outside").exists()


def test_the_sharded_layout_goes_through_the_same_commit(aws, tmp_path):
    """parallel=fsdp's layout (DCP's .metadata and shards) is committed, fetched and restored exactly."""
    model, optimizer = trained_objects()
    url = f"s3://{BUCKET}/sharded"
    save(checkpointer(tmp_path / "run", url, layout=files.Layout.dcp), model, optimizer, 1, final=True)
    assert {".metadata", "__0_0.distcp", "state.pt", "manifest.json"} <= {
        name.split("/")[-1] for name in objects("sharded") if name.startswith("checkpoints/step_00000001/")}
    chosen = find_resume("auto", tmp_path / "elsewhere", storage=Storage(url))
    fresh, fresh_optimizer = trained_objects(seed=1)
    restore(chosen, fresh, fresh_optimizer)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    saved, loaded = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
    assert all(torch.equal(saved[key]["exp_avg"], loaded[key]["exp_avg"]) for key in saved)


def test_resume_from_a_url_fetches_the_checkpoint_it_names(aws, tmp_path, caplog):
    """resume=<URL> (another run's checkpoint.dir, its checkpoints/ folder, or one step_N in it) downloads into
    <run dir>/fetched/, verifies, and is refused, naming the URL, when it cannot be used; a rank that does not
    write the run dir downloads nothing (it takes rank 0's choice when the workers start)."""
    caplog.set_level(logging.INFO, logger="runner.checkpoint.resume")
    model, optimizer = trained_objects()
    url = f"s3://{BUCKET}/named"
    saver = checkpointer(tmp_path / "first", url, keep_last=None)
    for step in (1, 2, 3):
        save(saver, model, optimizer, step)

    for given in (url, f"{url}/checkpoints/"):
        chosen = find_resume(given, tmp_path / "newest")
        assert chosen == tmp_path / "newest" / "fetched" / "step_00000003"
    assert f"resume={url}/checkpoints/: {url}/checkpoints/step_00000003 fetched into" in caplog.text
    named = find_resume(f"{url}/checkpoints/step_00000002", tmp_path / "named")
    assert named == tmp_path / "named" / "fetched" / "step_00000002"
    assert not (tmp_path / "named" / "checkpoints").exists()  # apart from the checkpoints this run will write
    fresh, fresh_optimizer = trained_objects(seed=1)
    restore(named, fresh, fresh_optimizer)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    assert find_resume(url, tmp_path / "rank1", fetch=False) is None and not (tmp_path / "rank1").exists()

    with pytest.raises(CheckpointError, match=r"resume: s3://ckpt/named/checkpoints/step_00000009 is not a "
                                              r"committed checkpoint \(no manifest.json there\); committed in "
                                              r"s3://ckpt/named/checkpoints: step_00000001, step_00000002, "
                                              r"step_00000003$"):
        find_resume(f"{url}/checkpoints/step_00000009", tmp_path / "missing")
    stored = Storage(url)
    weights = stored.path("checkpoints", "step_00000002", MODEL_FILE)
    data = bytearray(stored.fs.cat_file(weights))
    data[-1] ^= 0xFF
    stored.fs.pipe(weights, bytes(data))
    with pytest.raises(CheckpointError, match=r"resume: cannot load s3://ckpt/named/checkpoints/step_00000002: .*"
                                              r"does not match its sha256"):
        find_resume(f"{url}/checkpoints/step_00000002", tmp_path / "tampered")
    assert not (tmp_path / "tampered" / "fetched" / "step_00000002").exists()  # the damaged download is not kept
    manifest_path = stored.path("checkpoints", "step_00000003", files.MANIFEST)
    stored.fs.pipe(manifest_path, json.dumps({**json.loads(stored.fs.cat_file(manifest_path)), "finite": False})
                   .encode())
    caplog.clear()
    assert find_resume(url, tmp_path / "fallback").name == "step_00000001"  # 3 not finite, 2 damaged
    assert "passing over checkpoint s3://ckpt/named/checkpoints/step_00000003: its manifest says its weights " \
           "hold NaN or inf" in caplog.text
    with pytest.raises(CheckpointError, match=r"cannot load s3://ckpt/named/checkpoints/step_00000003: its "
                                              r"manifest says its weights hold NaN or inf"):
        find_resume(f"{url}/checkpoints/step_00000003", tmp_path / "nonfinite")

    with pytest.raises(CheckpointError, match=r"resume: s3://ckpt/empty holds no committed checkpoint"):
        find_resume(f"s3://{BUCKET}/empty", tmp_path / "empty")
    with pytest.raises(ConfigError, match=r"resume: is s3://ckpt/named/step_00000001, a step_N folder outside a "
                                          r"checkpoints/ folder .*give a checkpoint.dir URL"):
        find_resume(f"{url}/step_00000001", tmp_path / "outside")
    with pytest.raises(ConfigError, match=r"resume: is s3://no-such-bucket/x, which names a bucket that does not "
                                          r"exist"):
        find_resume("s3://no-such-bucket/x", tmp_path / "no_bucket")


UPLOAD = """
import sys
from pathlib import Path
from runner.checkpoint.remote import Storage
Storage(sys.argv[1]).upload(Path(sys.argv[2]))
"""


def test_an_upload_killed_midway_is_never_resumed_and_is_cleaned_up(aws, tmp_path, caplog):
    """kill -9 while a 128 MB checkpoint's weights are being uploaded in parts: its other objects are there, no
    manifest; it is not listed, resume=auto takes the previous one, and the next writer removes the leftovers."""
    url = f"s3://{BUCKET}/killed"
    model, optimizer = trained_objects()
    save(checkpointer(tmp_path / "run", url), model, optimizer, 1)  # committed
    torch.manual_seed(0)
    big = torch.nn.Linear(4096, 8192)  # 128 MB of weights: uploaded in 50 MiB parts
    local = checkpointer(tmp_path / "local", None)  # sealed on disk only, then uploaded by a process we kill
    save(local, big, torch.optim.SGD(big.parameters(), lr=0.1), 2)
    sealed = tmp_path / "local" / "checkpoints" / "step_00000002"
    uploader = subprocess.Popen([sys.executable, "-c", UPLOAD, url, str(sealed)], cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    uploads = client("s3", aws)
    try:
        wait_for(lambda: uploads.list_multipart_uploads(Bucket=BUCKET).get("Uploads")
                 or uploader.poll() is not None, "the weights' upload to be under way")
        assert uploader.poll() is None, "the upload ended before it could be killed"
        uploader.send_signal(signal.SIGKILL)
    finally:
        uploader.kill()
        uploader.wait()
    names = objects("killed")
    assert "checkpoints/step_00000002/state.pt" in names  # the smaller files went first
    assert not any(name.startswith("checkpoints/step_00000002/") and name.endswith((MODEL_FILE, "manifest.json"))
                   for name in names)
    stored = Storage(url)
    assert [name for name, _ in stored.committed()] == ["step_00000001"]
    assert find_resume("auto", tmp_path / "elsewhere", storage=stored).name == "step_00000001"

    checkpointer(tmp_path / "next", url)  # the next run on this prefix, before it writes anything
    assert "removed s3://ckpt/killed/checkpoints/step_00000002, left by an interrupted upload" in caplog.text
    assert not any(name.startswith("checkpoints/step_00000002") for name in objects("killed"))
    for upload in uploads.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []):  # S3 expires these by rule
        uploads.abort_multipart_upload(Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"])


def test_bad_credential_or_missing_bucket_fails_before_training(aws, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    result = run_cli(*RUN, f"checkpoint.dir=s3://{BUCKET}/denied", "hydra.run.dir=denied", cwd=tmp_path)
    assert result.returncode == 1
    assert "checkpoint.dir: is s3://ckpt/denied, which refused the credentials. For S3 set AWS_ACCESS_KEY_ID" in \
        result.output and "Nothing was trained or written there" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "denied" / "metrics.jsonl").exists()
    result = run_cli(*RUN, f"resume=s3://{BUCKET}/denied", "hydra.run.dir=denied_resume", cwd=tmp_path)
    assert result.returncode == 1
    assert "resume: is s3://ckpt/denied, which refused the credentials. For S3 set AWS_ACCESS_KEY_ID" in \
        result.output and "the identity needs to list and read objects there" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "denied_resume" / "metrics.jsonl").exists()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", aws["AWS_SECRET_ACCESS_KEY"])
    with pytest.raises(ConfigError, match=r"is s3://no-such-bucket/x, which names a bucket that does not exist"):
        Storage("s3://no-such-bucket/x").check()
    with pytest.raises(ConfigError, match=r"is /shared/checkpoints; give a URL"):
        Storage("/shared/checkpoints")
    if importlib.util.find_spec("gcsfs") is None:
        with pytest.raises(ConfigError, match=r"is gs://bucket/x, which needs gcsfs"):
            Storage("gs://bucket/x")
    with pytest.raises(ConfigError, match=r"is nosuch://bucket/x, which fsspec cannot open"):
        Storage("nosuch://bucket/x")


def test_a_run_resumes_exactly_on_a_machine_without_its_run_dir(aws, tmp_path):
    """`python -m runner checkpoint.dir=s3://...` killed after a committed checkpoint; the run dir is lost (another
    node); the same command with resume=auto and a new run dir continues from the bucket, bitwise, and so does a
    new run (no checkpoint.dir) given resume=<the committed checkpoint's URL>."""
    url = f"s3://{BUCKET}/exact"
    one_epoch = "trainer.max_epochs=1"  # 16 steps: enough to kill after step 6 and continue (suite time)
    reference = run_cli(*RUN, one_epoch, f"checkpoint.dir=s3://{BUCKET}/reference", "hydra.run.dir=reference",
                        cwd=tmp_path)
    assert reference.returncode == 0, reference.output
    stored = Storage(url)
    proc = start(tmp_path, tmp_path / "lost", 6, one_epoch, f"checkpoint.dir={url}")  # the environment holds the key
    try:
        wait_for(lambda: [manifest["step"] for _, manifest in stored.committed() if manifest["step"] >= 6],
                 "a checkpoint at step >= 6 committed to the bucket")
    finally:
        kill_everything(proc)
    committed = stored.committed()[-1][1]["step"]
    assert committed < 16, "the kill came too late to test anything"
    checkpoint = f"{url}/checkpoints/step_{committed:08d}"
    from_url = run_cli(*RUN, one_epoch, f"resume={checkpoint}", "hydra.run.dir=from_url", cwd=tmp_path)
    assert from_url.returncode == 0, from_url.output
    assert f"resumed from {tmp_path / 'from_url' / 'fetched' / f'step_{committed:08d}'}: step {committed}," in \
        from_url.output
    result = run_cli(*RUN, one_epoch, f"checkpoint.dir={url}", "resume=auto", "hydra.run.dir=elsewhere", cwd=tmp_path)
    assert result.returncode == 0, result.output
    assert f"resume=auto: {checkpoint} is the newest intact checkpoint there" in result.output
    expected = load_file(tmp_path / "reference" / "export" / "final.safetensors")
    expected_losses = dict(read_scalars(tmp_path / "reference", "train/loss"))
    for name in ("elsewhere", "from_url"):
        final = load_file(tmp_path / name / "export" / "final.safetensors")
        assert final.keys() == expected.keys() and all(torch.equal(final[key], expected[key]) for key in expected)
        losses = dict(read_scalars(tmp_path / name, "train/loss"))
        assert min(losses) > committed and losses == {step: expected_losses[step] for step in losses}, name
    assert stored.fs.cat_file(stored.path("export", "final.safetensors")) == \
        (tmp_path / "elsewhere" / "export" / "final.safetensors").read_bytes()


def test_torchrun_ranks_resume_from_the_checkpoint_rank_0_fetched(aws, tmp_path):
    """Under torchrun each rank decides in its own process and only rank 0 downloads resume=<URL>: every rank
    must continue from rank 0's copy (broadcast when the workers start), not start from scratch."""
    url = f"s3://{BUCKET}/torchrun"
    first = run_cli(*RUN, "trainer.max_steps=3", f"checkpoint.dir={url}", "hydra.run.dir=first", cwd=tmp_path)
    assert first.returncode == 0, first.output
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "runner",
               "hardware=multi_cpu", *RUN, "trainer.max_steps=5", f"resume={url}/checkpoints/step_00000003",
               "hydra.run.dir=continued", "hardware.timeout_s=120"]  # ranks that disagree fail, not hang
    result = subprocess.run(command, cwd=tmp_path, env={**os.environ, **HELPERS_ENV}, capture_output=True, text=True,
                            timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    fetched = tmp_path / "continued" / "fetched" / "step_00000003"
    for rank in (0, 1):
        log = (tmp_path / "continued" / f"runner_rank{rank}.log").read_text()
        assert f"resumed from {fetched}: step 3," in log, log
    assert [row["step"] for row in read_jsonl(tmp_path / "continued" / "metrics.jsonl") if "train/loss" in row] \
        == [4, 5]


def test_an_upload_that_fails_during_training_names_the_storage(aws, tmp_path, monkeypatch):
    """A key revoked during the run: the next checkpoint's upload fails with one message naming the storage, and
    the checkpoint is complete on disk."""
    iam = client("iam", aws)  # as the fixture's user, allowed everything
    iam.create_user(UserName="revoked")
    iam.put_user_policy(UserName="revoked", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="revoked")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    model, optimizer = trained_objects()
    saver = checkpointer(tmp_path, f"s3://{BUCKET}/revoked")
    save(saver, model, optimizer, 1)
    iam.delete_access_key(UserName="revoked", AccessKeyId=key["AccessKeyId"])
    with pytest.raises(CheckpointError, match=r"checkpoint: uploading step_00000002 to s3://ckpt/revoked/checkpoints "
                                              r"failed \(PermissionError: .*\); it was not committed there, and is "
                                              r"complete in .*resume=auto on this machine continues from it"):
        save(saver, model, optimizer, 2)
    assert files.damage(tmp_path / "checkpoints" / "step_00000002") is None


def test_storage_that_goes_away_during_training_names_the_storage(aws, tmp_path):
    """The S3 server unreachable at the next upload: botocore's EndpointConnectionError, which is no OSError, ended
    the run in a 200-line traceback. It is one message naming the storage, and the checkpoint is complete on
    disk."""
    import s3fs

    model, optimizer = trained_objects()
    saver = checkpointer(tmp_path, f"s3://{BUCKET}/gone")
    save(saver, model, optimizer, 1)
    # The same bucket behind an endpoint where nothing listens (the discard port), with no retries to wait out.
    saver.storage.fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": "http://127.0.0.1:9"},
                                         config_kwargs={"retries": {"max_attempts": 1}}, skip_instance_cache=True)
    with pytest.raises(CheckpointError, match=r"checkpoint: uploading step_00000002 to s3://ckpt/gone/checkpoints "
                                              r"failed \(EndpointConnectionError: .*\); it was not committed there"):
        save(saver, model, optimizer, 2)
    assert files.damage(tmp_path / "checkpoints" / "step_00000002") is None


def test_missing_credentials_are_not_called_a_network_problem():
    """No AWS key at all: it said 'a wrong endpoint, or no network?'."""
    from botocore.exceptions import NoCredentialsError

    from runner.checkpoint.remote import _access_message

    message = _access_message("s3://ckpt/x", NoCredentialsError())
    assert message.startswith("is s3://ckpt/x, which found no credentials to use. For S3 set AWS_ACCESS_KEY_ID")
    assert "no network" not in message
