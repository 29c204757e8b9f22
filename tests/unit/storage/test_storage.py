"""Every storage behaviour, against both a local folder and a real S3 server (moto)."""
from __future__ import annotations

import os
import time

import pytest

from orchestrator.storage import LocalStore, PreconditionFailed, open_store, split_run_uri, store_from_config
from orchestrator.storage.s3 import S3Store, parse_s3_uri

MIB = 1024 * 1024


def test_round_trip_list_size_delete(store):
    store.put_bytes("exp1/a.txt", b"hello")
    store.put_bytes("exp1/sub/b.bin", b"\x00" * 10)
    store.put_bytes("exp2/c.txt", b"c")
    assert store.get_bytes("exp1/a.txt") == b"hello"
    assert store.list("exp1/") == ["exp1/a.txt", "exp1/sub/b.bin"]
    assert store.list("exp1/s") == ["exp1/sub/b.bin"]
    assert store.list() == ["exp1/a.txt", "exp1/sub/b.bin", "exp2/c.txt"]
    assert store.size("exp1/sub/b.bin") == 10
    assert store.exists("exp1/a.txt") and not store.exists("exp1/nope")
    store.put_bytes("exp1/a.txt", b"replaced")
    assert store.get_bytes("exp1/a.txt") == b"replaced"
    store.delete("exp1/a.txt")
    store.delete("exp1/a.txt")  # a missing key is not an error
    assert not store.exists("exp1/a.txt")
    store.delete_prefix("exp1/")
    assert store.list() == ["exp2/c.txt"]


def test_missing_key_raises_file_not_found(store, tmp_path):
    with pytest.raises(FileNotFoundError):
        store.get_bytes("nope/ledger.json")
    with pytest.raises(FileNotFoundError):
        store.get_versioned("nope/ledger.json")
    with pytest.raises(FileNotFoundError):
        store.size("nope")
    with pytest.raises(FileNotFoundError):
        store.download_file("nope", tmp_path / "out")
    assert store.list("nope/") == []


def test_failed_download_leaves_no_partial_file(store, tmp_path):
    dest_dir = tmp_path / "dl"
    dest_dir.mkdir()
    dest = dest_dir / "weights.bin"
    dest.write_bytes(b"previous")
    with pytest.raises(FileNotFoundError):
        store.download_file("missing/weights.bin", dest)
    assert dest.read_bytes() == b"previous"  # untouched
    assert sorted(p.name for p in dest_dir.iterdir()) == ["weights.bin"]  # no temp file left behind


def test_download_replaces_atomically(store, tmp_path):
    store.put_bytes("k/file", b"new content")
    dest = tmp_path / "deep" / "out.bin"
    store.download_file("k/file", dest)
    assert dest.read_bytes() == b"new content"
    assert [p.name for p in dest.parent.iterdir()] == ["out.bin"]


def test_conditional_create_and_replace(store):
    v1 = store.put_if("run/ledger.json", b"one", if_version=None)
    with pytest.raises(PreconditionFailed):
        store.put_if("run/ledger.json", b"two", if_version=None)  # exists: create refused
    data, version = store.get_versioned("run/ledger.json")
    assert (data, version) == (b"one", v1)
    v2 = store.put_if("run/ledger.json", b"two", if_version=v1)
    assert v2 != v1
    with pytest.raises(PreconditionFailed):
        store.put_if("run/ledger.json", b"three", if_version=v1)  # stale version
    assert store.get_versioned("run/ledger.json") == (b"two", v2)
    with pytest.raises(PreconditionFailed):
        store.put_if("run/absent.json", b"x", if_version=v2)  # replacing what is not there


def test_large_upload_goes_multipart_and_round_trips(tmp_path, request, s3_server, s3_bucket):
    big = tmp_path / "big.bin"
    payload = os.urandom(12 * MIB)
    big.write_bytes(payload)
    stores = {
        "local": LocalStore(tmp_path / "store"),
        "s3": S3Store(s3_bucket, endpoint_url=s3_server.endpoint_url, multipart_threshold_mb=5),
    }
    for name, store in stores.items():
        store.upload_file(big, "run/ckpt/model.safetensors")
        assert store.size("run/ckpt/model.safetensors") == len(payload), name
        out = tmp_path / f"out-{name}.bin"
        store.download_file("run/ckpt/model.safetensors", out)
        assert out.read_bytes() == payload, name
    s3 = stores["s3"]
    head = s3.client.head_object(Bucket=s3.bucket, Key="runs/run/ckpt/model.safetensors")
    # A multipart object's ETag is "<md5 of part md5s>-<part count>": 12 MiB in 5 MiB parts is 3.
    assert head["ETag"].strip('"').endswith("-3")


@pytest.mark.e2e
def test_checksum_compat_store_works(s3_server, s3_bucket, tmp_path):
    store = S3Store(s3_bucket, endpoint_url=s3_server.endpoint_url, checksum_compat=True, multipart_threshold_mb=5)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(11 * MIB))
    store.upload_file(big, "r/big.bin")
    store.download_file("r/big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == big.read_bytes()
    v = store.put_if("r/ledger.json", b"{}", if_version=None)
    store.put_if("r/ledger.json", b"{1}", if_version=v)
    assert store.get_bytes("r/ledger.json") == b"{1}"


def test_abort_incomplete_uploads_s3(s3_store):
    client = s3_store.client
    upload = client.create_multipart_upload(Bucket=s3_store.bucket, Key="runs/exp1/ckpt/part.bin")
    client.upload_part(
        Bucket=s3_store.bucket, Key="runs/exp1/ckpt/part.bin", UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * 100
    )
    # An upload outside the store's prefix is not ours to abort.
    other = client.create_multipart_upload(Bucket=s3_store.bucket, Key="elsewhere/file.bin")
    assert s3_store.abort_incomplete_uploads() == 1
    remaining = client.list_multipart_uploads(Bucket=s3_store.bucket).get("Uploads", [])
    assert [u["UploadId"] for u in remaining] == [other["UploadId"]]
    assert s3_store.abort_incomplete_uploads() == 0


def test_abort_incomplete_uploads_local_removes_stale_temp_files(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.put_bytes("exp1/ckpt/a.bin", b"a")
    stale = tmp_path / "store" / "exp1" / "ckpt" / ".orch-tmp-b.bin-abc"
    fresh = tmp_path / "store" / "exp1" / "ckpt" / ".orch-tmp-c.bin-def"
    stale.write_bytes(b"partial")
    fresh.write_bytes(b"being written")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    assert store.list("exp1/") == ["exp1/ckpt/a.bin"]  # temp files are never listed
    assert store.abort_incomplete_uploads("exp1/") == 1
    assert not stale.exists() and fresh.exists()


def test_a_process_forked_while_a_conditional_write_holds_the_lock_does_not_keep_it(tmp_path):
    """A DataLoader worker forked while the checkpoint thread held the ledger's lock kept the lock (flock belongs
    to the open file) for its whole life: the attempt's next heartbeat waited forever (a hang seen in the suite)."""
    import multiprocessing
    import threading

    store = LocalStore(tmp_path)
    version = store.put_if("run/ledger.json", b"a", if_version=None)
    holding, release = threading.Event(), threading.Event()

    def commit_thread():
        with store._locked(store._path("run/ledger.json")):
            holding.set()
            release.wait(10)

    committer = threading.Thread(target=commit_thread)
    committer.start()
    assert holding.wait(10)
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))  # a DataLoader worker
    child.start()
    try:
        release.set()
        committer.join(10)
        heartbeat = threading.Thread(target=store.put_if, args=("run/ledger.json", b"b"),
                                     kwargs={"if_version": version}, daemon=True)
        heartbeat.start()
        heartbeat.join(5)
        assert not heartbeat.is_alive(), "the forked child still holds the ledger's lock"
        assert store.get_bytes("run/ledger.json") == b"b"
    finally:
        child.kill()
        child.join()


def test_local_store_rejects_escaping_keys(tmp_path):
    store = LocalStore(tmp_path / "store")
    for key in ("../outside", "/abs", "a//b", "a/./b", ""):
        with pytest.raises(ValueError):
            store.put_bytes(key, b"x")


def test_open_store_picks_backend(tmp_path, s3_server):
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert open_store(f"file://{tmp_path}").uri == str(tmp_path)
    s3 = open_store("s3://bucket-name/runs/", endpoint_url=s3_server.endpoint_url)
    assert isinstance(s3, S3Store) and (s3.bucket, s3.prefix) == ("bucket-name", "runs")
    with pytest.raises(ValueError, match="s3://bucket/prefix"):
        open_store("gs://bucket/runs")

    from orchestrator.config.schema import StorageConfig

    cfg = StorageConfig(uri="s3://bucket-name/p", endpoint_url=s3_server.endpoint_url, checksum_compat=True,
                        multipart_threshold_mb=8)
    cfg_store = store_from_config(cfg)
    assert cfg_store.transfer_config.multipart_threshold == 8 * MIB


def test_a_second_s3_store_reads_no_service_model_again_and_keeps_its_own_credentials(s3_server, s3_bucket,
                                                                                      monkeypatch):
    """Each store is a new session (credentials read as a fresh one reads them) over one loader of botocore's
    models per process: a new loader read the JSON models again, about 0.1 CPU-s per store."""
    from botocore.loaders import JSONFileLoader

    S3Store(s3_bucket, endpoint_url=s3_server.endpoint_url)  # the process's first store loads the models
    read = []
    real = JSONFileLoader.load_file
    monkeypatch.setattr(JSONFileLoader, "load_file", lambda self, path: read.append(path) or real(self, path))
    second = S3Store(s3_bucket, endpoint_url=s3_server.endpoint_url)
    second.put_bytes("shared-loader/a", b"x")
    assert second.get_bytes("shared-loader/a") == b"x"
    assert read == []
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "another-key")
    third = S3Store(s3_bucket, endpoint_url=s3_server.endpoint_url)
    assert third.client._request_signer._credentials.access_key == "another-key"  # not the first session's


def test_missing_bucket_is_a_user_error(s3_server):
    from orchestrator.core.errors import UserError

    store = S3Store("s3://no-such-bucket-here/runs", endpoint_url=s3_server.endpoint_url)
    with pytest.raises(UserError, match="does not exist"):
        store.put_bytes("a", b"x")
    with pytest.raises(UserError, match="does not exist"):
        store.upload_file(__file__, "a")  # the transfer manager wraps the error; still translated


def test_split_run_uri():
    assert split_run_uri("s3://b/runs/exp1") == ("s3://b/runs", "exp1")
    assert split_run_uri("s3://b/exp1/") == ("s3://b", "exp1")
    assert split_run_uri(".cache/runs/exp1") == (".cache/runs", "exp1")
    assert split_run_uri("file:///tmp/r/exp1") == ("file:///tmp/r", "exp1")
    assert split_run_uri("exp1") == (".", "exp1")
    with pytest.raises(ValueError, match="names no run"):
        split_run_uri("s3://b")
    assert parse_s3_uri("s3://b/a/b/") == ("b", "a/b")
