"""deep_sleep.core.files on a local path and on the local S3 (moto's server, loopback): URLs keep their
``scheme://``, a directory published to a bucket fetches back byte for byte, a missing one is a clear
error, and fsspec's own ``FSSPEC_S3_ENDPOINT_URL`` reaches the same endpoint in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deep_sleep.core import files
from deep_sleep.core.errors import InputError


def test_urls_keep_their_scheme_and_local_paths_stay_paths(tmp_path):
    assert files.is_remote("s3://b/runs") and not files.is_remote("file:///x") and not files.is_remote("/x")
    assert files.join("s3://b/runs/", "a", "diff") == "s3://b/runs/a/diff"
    assert files.parent("s3://b/runs/a/diff") == "s3://b/runs/a"
    assert files.join(str(tmp_path), "a") == str(tmp_path / "a")
    assert files.parent(str(tmp_path / "a")) == str(tmp_path.resolve())
    assert files.local_path("file:///tmp/x") == Path("/tmp/x")
    assert files.published_name(tmp_path / "d" / "r.json", tmp_path, "s3://b/q") == "s3://b/q/d/r.json"
    assert files.published_name(None, tmp_path, "s3://b/q") is None


def test_runs_dir_refuses_a_url_and_runs_location_keeps_it(monkeypatch):
    from deep_sleep.run.layout import runs_dir, runs_location

    assert runs_location("s3://b/runs") == "s3://b/runs"
    monkeypatch.setenv("DEEP_SLEEP_RUNS_DIR", "s3://b/env")
    assert runs_location(None) == "s3://b/env"
    with pytest.raises(InputError, match="s3://b/env is an object-store URL"):
        runs_dir(None)


def test_publish_and_fetch_a_directory_through_the_local_s3(s3_bucket, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha")
    (src / "sub" / "b.bin").write_bytes(bytes(range(256)))
    (src / ".hidden.tmp").write_text("never published")
    url = f"s3://{s3_bucket}/runs/x"
    files.publish_dir(src, url)
    got = files.fetch_dir(url, cache=tmp_path / "cache")
    assert sorted(p.relative_to(got).as_posix() for p in got.rglob("*") if p.is_file()) == ["a.txt", "sub/b.bin"]
    assert (got / "sub" / "b.bin").read_bytes() == bytes(range(256))
    (src / "a.txt").write_text("rewritten")
    files.publish_file(src / "a.txt", files.join(url, "a.txt"))
    assert (files.fetch_dir(url, cache=tmp_path / "cache") / "a.txt").read_text() == "rewritten"  # fetched again
    with pytest.raises(InputError, match="no such directory"):
        files.fetch_dir(f"s3://{s3_bucket}/nothing/here", cache=tmp_path / "cache")


def test_fsspec_s3_endpoint_url_alone_reaches_the_local_s3_in_a_fresh_process(s3_bucket, s3_endpoint, tmp_path):
    url = f"s3://{s3_bucket}/sub"
    (tmp_path / "f.txt").write_text("from the parent")
    files.publish_dir(tmp_path, url)
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")}
    env["FSSPEC_S3_ENDPOINT_URL"] = s3_endpoint
    code = ("import sys; from deep_sleep.core.files import fetch_dir; from pathlib import Path; "
            f"print((fetch_dir({url!r}, cache=Path(sys.argv[1])) / 'f.txt').read_text())")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache")], env=env, capture_output=True, check=False,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "from the parent", out.stderr[-2000:]
