"""The local S3 of the tests (moto's server, started by the ``s3_endpoint`` fixture of conftest.py)."""

from __future__ import annotations

import uuid


def new_bucket(endpoint: str) -> str:
    """Create a bucket with a fresh name through s3fs and check that the request reached the local
    server (moto's in-process backend holds it), not AWS; returns its name."""
    import s3fs
    from moto.s3.models import s3_backends

    name = f"ds-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(name)
    assert any(name in backend.buckets for region in s3_backends.values() for backend in region.values()), \
        f"bucket {name} was not created on the local S3 at {endpoint}"
    return name


def fresh_s3():
    """An s3fs file system with no cached listings (a new client)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    return s3fs.S3FileSystem()
