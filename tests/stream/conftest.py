"""An S3-compatible server for the tests of packs: moto's server mode in a thread of the test
process, on a free loopback port, with every request it answers logged (method, key, bytes sent)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("litdata")
pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

BUCKET = "detdata"


@dataclass
class S3Server:
    """A running moto server: ``endpoint``, a boto3 ``client``, and ``log``: one
    ``(method, path, bytes)`` per request answered."""

    server: moto_server.ThreadedMotoServer
    endpoint: str
    log: list[tuple[str, str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def upload(self, folder: Path, prefix: str) -> str:
        """Every file of ``folder`` under ``s3://BUCKET/prefix/``; the URL."""
        client = self.client()
        for path in sorted(folder.iterdir()):
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")
        return f"s3://{BUCKET}/{prefix}"

    def gets(self, key_part: str = "") -> list[tuple[str, int]]:
        """``(path, bytes)`` of each GET whose path holds ``key_part``."""
        with self.lock:
            return [(p, n) for m, p, n in self.log if m == "GET" and key_part in p]

    def stop(self) -> None:
        """Stop the server (again: nothing)."""
        if self.server._thread is not None:
            self.server.stop()
            self.server._thread = None


class _CountingServer(moto_server.ThreadedMotoServer):
    """moto's threaded server with its WSGI app wrapped to log each request's bytes."""

    def __init__(self, record: S3Server | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.record = record

    def _server_entry(self) -> None:
        from werkzeug.serving import make_server

        app = moto_server.DomainDispatcherApplication(moto_server.create_backend_app)
        record = self.record

        def counted(environ, start_response):
            body = list(app(environ, start_response))
            with record.lock:
                record.log.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), sum(map(len, body))))
            return body

        self._server = make_server(self._ip_address, self._port, counted, True,
                                   request_handler=moto_server.MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()


def start_s3() -> S3Server:
    """A new moto server on a free port, with the bucket made."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = _CountingServer(ip_address="127.0.0.1", port=0, verbose=False)
    record = S3Server(server=server, endpoint="")
    server.record = record
    server.start()
    host, port = server.get_host_and_port()
    record.endpoint = f"http://{host}:{port}"
    record.client().create_bucket(Bucket=BUCKET)
    return record


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto server for the session (tests use their own key prefixes)."""
    with pytest.MonkeyPatch.context() as mp:  # credentials for the bucket made here
        _s3_env(mp, "")
        record = start_s3()
    yield record
    record.stop()


def _s3_env(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    if endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    monkeypatch.setenv("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def own_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """A server of the test's own (one it may stop), reached through the environment as ``s3``."""
    _s3_env(monkeypatch, "")
    record = start_s3()
    _s3_env(monkeypatch, record.endpoint)
    yield record
    record.stop()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The session's server, reached the usual way: AWS_ENDPOINT_URL and dummy credentials in
    the environment (boto3 >= 1.36 checksums only when required: moto's answer to a GET)."""
    _s3_env(monkeypatch, s3_server.endpoint)
    return s3_server
