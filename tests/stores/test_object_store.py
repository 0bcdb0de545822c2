"""The archive's filesystem without a server: a local ``file://`` archive round-trips, the settings choose the
backend, and what cannot work is a named error (the S3 side runs against S3Proxy in tests/deploy)."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest

from runjournal.core.errors import ConfigError
from runjournal.core.settings import Settings
from runjournal.stores.errors import ObjectStoreError
from runjournal.stores.object_store import filesystem


def test_the_default_archive_is_a_local_folder_under_the_stack(tmp_path: Path) -> None:
    settings = Settings.load(stack_dir=tmp_path / "stack")
    assert settings.archive_url is None and settings.effective_archive_url == (tmp_path / "stack/archive").as_uri()
    fs, root = filesystem(settings)
    assert root == str(tmp_path / "stack" / "archive") and Path(root).is_dir()
    fs.pipe(f"{root}/runs/a.parquet", b"PAR1")
    assert fs.ls(f"{root}/runs", detail=False) == [f"{root}/runs/a.parquet"]
    assert fs.cat(f"{root}/runs/a.parquet") == b"PAR1" == (tmp_path / "stack/archive/runs/a.parquet").read_bytes()
    fs.rm(f"{root}/runs/a.parquet")
    assert not fs.exists(f"{root}/runs/a.parquet")


@pytest.mark.parametrize("url", ["file://{p}/elsewhere", "{p}/elsewhere"])
def test_a_file_url_or_a_plain_path_is_the_folder(tmp_path: Path, url: str) -> None:
    _fs, root = filesystem(Settings.load(stack_dir=tmp_path, archive_url=url.format(p=tmp_path)))
    assert root == str(tmp_path / "elsewhere") and Path(root).is_dir()


def test_an_s3_url_gives_s3fs_with_the_endpoint_and_keys(tmp_path: Path) -> None:
    settings = Settings.load(stack_dir=tmp_path, archive_url="s3://bucket/some/prefix/",
                             object_store_endpoint="http://127.0.0.1:9", object_store_key="AK",
                             object_store_secret="s3cr3t")
    fs, root = filesystem(settings)
    assert type(fs).__name__ == "S3FileSystem" and root == "bucket/some/prefix"
    assert fs.client_kwargs == {"endpoint_url": "http://127.0.0.1:9"} and fs.key == "AK" and fs.secret == "s3cr3t"
    assert "s3cr3t" not in repr(settings) and "s3cr3t" not in json.dumps(settings.masked())
    assert settings.as_env()["RUNJOURNAL_OBJECT_STORE_SECRET"] == "s3cr3t"  # a child gets what its parent has


def test_an_unknown_scheme_or_a_missing_bucket_is_named(tmp_path: Path) -> None:
    with pytest.raises(ObjectStoreError, match="RUNJOURNAL_ARCHIVE_URL=gs://b: unknown scheme 'gs'"):
        filesystem(Settings.load(stack_dir=tmp_path, archive_url="gs://b"))
    with pytest.raises(ObjectStoreError, match="needs a bucket"):
        filesystem(Settings.load(stack_dir=tmp_path, archive_url="s3:///prefix"))


def test_s3_without_s3fs_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_s3fs(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "s3fs":
            raise ImportError("No module named 's3fs'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_s3fs)
    with pytest.raises(ConfigError, match=r"pip install 'runjournal\[archive\]'"):
        filesystem(Settings.load(stack_dir=tmp_path, archive_url="s3://bucket/p"))
