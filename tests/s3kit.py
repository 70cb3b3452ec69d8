"""A real S3-compatible server on loopback for tests: moto's server (HTTP on 127.0.0.1,
in a thread of the test process), and stores on buckets of their own.

Since the server runs in this process, a test can make a stored object look old by
moving its ``LastModified`` back (:func:`age_object`), as ``os.utime`` does for a file.
"""

from __future__ import annotations

import datetime
import uuid

from b2bhub.payloads.s3 import MIN_PART_SIZE, S3PayloadStore

#: what the processes and stores of the tests sign with (moto takes any key)
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


class S3Server:
    """moto's server on a free loopback port, until :meth:`stop`."""

    def __init__(self):
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"

    def env(self, bucket: str, prefix: str = "payloads") -> dict[str, str]:
        """The environment of a process whose payload store is ``s3://bucket/prefix``."""
        return {**CREDENTIALS, "B2BHUB_PAYLOAD_URL": f"s3://{bucket}/{prefix}",
                "B2BHUB_S3_ENDPOINT_URL": self.endpoint_url}

    def store(self, bucket: str | None = None, prefix: str = "payloads",
              **options) -> S3PayloadStore:
        """A store on ``bucket`` (a new one by default, created here); parts of the
        smallest size S3 allows, so a multipart upload needs little data."""
        store = S3PayloadStore(bucket or new_bucket(), prefix, endpoint_url=self.endpoint_url,
                               client_options=client_options(),
                               part_size=options.pop("part_size", MIN_PART_SIZE), **options)
        if bucket is None:
            store.client.create_bucket(Bucket=store.bucket)
        return store

    def stop(self) -> None:
        self._server.stop()


def new_bucket() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def client_options() -> dict:
    return {"aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}


def age_object(bucket: str, key: str, seconds: float) -> None:
    """Make the object ``key`` look ``seconds`` older (every version of it)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    keys = s3_backends[DEFAULT_ACCOUNT_ID]["global"].buckets[bucket].keys.getlist(key)
    assert keys, f"no object {key} in {bucket}"
    for item in keys:
        item.last_modified = item.last_modified - datetime.timedelta(seconds=seconds)
