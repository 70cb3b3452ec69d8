"""How the S3 store sends the PutObject and GetObject of every message (directly, signed
by botocore's signer, not through the client's call machinery): signed right, refused
when signed wrong, retried as the client retries, failing with the client's exceptions,
addressed as the client addresses, a pool of its own in a forked process.

Against moto's server (``s3_server``) and a server of our own that checks signatures
itself (``tests/s3_peer.py``)."""

from __future__ import annotations

import hashlib
import os
import socket

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from b2bhub.payloads.s3 import S3PayloadStore, object_url
from b2bhub.payloads.store import PayloadMissing
from tests.s3_peer import S3Peer

DOC = b"<order id='1'>" + b"x" * 10_000 + b"</order>"
BUCKET = "peer-bucket"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def peer(monkeypatch):
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    server = S3Peer(keys={"AKIDRIGHT": "the-right-secret"}, bucket=BUCKET)
    yield server
    server.stop()


def peer_store(peer: S3Peer, secret: str = "the-right-secret", **options) -> S3PayloadStore:
    return S3PayloadStore(BUCKET, "payloads", endpoint_url=peer.endpoint_url,
                          client_options={"aws_access_key_id": "AKIDRIGHT",
                                          "aws_secret_access_key": secret, **options})


def client_calls(store: S3PayloadStore) -> list[str]:
    """The operations the store's boto3 client is called for from now on."""
    calls: list[str] = []
    store.client.meta.events.register(
        "before-call.s3", lambda model, **_: calls.append(model.name))
    return calls


def test_put_and_get_are_signed_right_and_not_made_by_the_client(peer):
    store = peer_store(peer)
    calls = client_calls(store)
    stored = store.put(DOC)
    with store.open(stored.digest) as stream:
        assert stream.read() == DOC and stream.verified
    assert store.read_ahead({stored.digest: stored.size}) == {stored.digest: DOC}

    assert calls == []  # neither through botocore's call machinery
    assert [(s.method, s.path, s.verified) for s in peer.seen] == [
        ("PUT", f"/{BUCKET}/payloads/{stored.digest}", True),
        ("GET", f"/{BUCKET}/payloads/{stored.digest}", True),
        ("GET", f"/{BUCKET}/payloads/{stored.digest}", True)]
    put = {k.lower(): v for k, v in peer.seen[0].headers.items()}
    assert put["x-amz-content-sha256"] == stored.digest  # the key's own hash, signed
    assert peer.objects[f"/{BUCKET}/payloads/{stored.digest}"] == DOC


def test_a_wrong_secret_key_is_refused_as_the_client_is_refused(peer):
    right, wrong = peer_store(peer), peer_store(peer, secret="not-the-secret")
    stored = right.put(DOC)
    with pytest.raises(ClientError) as put_info:
        wrong.put(DOC + b"more")
    assert put_info.value.operation_name == "PutObject"
    assert put_info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as client_info:  # the client signs wrong the same way
        wrong.client.put_object(Bucket=BUCKET, Key="payloads/x", Body=b"x")
    assert str(put_info.value).replace("PutObject", "") == \
        str(client_info.value).replace("PutObject", "")

    with pytest.raises(ClientError) as get_info:  # refused, not missing
        wrong.open(stored.digest)
    assert (get_info.value.operation_name, get_info.value.response["Error"]["Code"]) == (
        "GetObject", "SignatureDoesNotMatch")
    assert wrong.read_ahead({stored.digest: stored.size}) == {}
    assert [s.verified for s in peer.seen] == [True, False, False, False, False]
    assert set(peer.objects) == {f"/{BUCKET}/payloads/{stored.digest}"}


def test_a_session_token_is_sent_and_signed(peer):
    store = peer_store(peer, aws_session_token="the-session-token")
    store.put(DOC)
    [seen] = peer.seen
    assert seen.verified and seen.headers["X-Amz-Security-Token"] == "the-session-token"
    assert "x-amz-security-token" in seen.headers["Authorization"]


def test_credentials_are_read_per_request(peer):
    """What the client's credentials say now signs the next request (refreshable
    credentials renew themselves under the same client)."""
    store = peer_store(peer)
    store.put(DOC)
    credentials = store.client._get_credentials()
    credentials.secret_key = "rotated-secret"  # as a refresh would replace it
    peer.keys["AKIDRIGHT"] = "rotated-secret"
    stored = store.put(DOC + b"2")
    with store.open(stored.digest) as stream:
        assert stream.read() == DOC + b"2"
    assert [s.verified for s in peer.seen] == [True, True, True]


def test_a_missing_object_is_payload_missing(peer, s3_server):
    for store in (peer_store(peer), s3_server.store()):
        digest = sha(b"never stored")
        with pytest.raises(PayloadMissing) as info:
            store.open(digest)
        assert info.value.digest == digest
        assert store.read_ahead({digest: 10}) == {}


def test_refusals_carry_the_code_and_message_the_client_raises(s3_server):
    """A GetObject on a bucket that is not there: the same exception class, code, message
    and text as the client's own call."""
    store = s3_server.store()
    gone = S3PayloadStore("no-such-bucket-here", "payloads", endpoint_url=store.endpoint_url,
                          client_options=store._client_options)
    digest = sha(DOC)
    with pytest.raises(ClientError) as ours:
        gone.open(digest)
    with pytest.raises(ClientError) as clients:
        gone.client.get_object(Bucket=gone.bucket, Key=gone.key(digest))
    assert type(ours.value) is type(clients.value)
    assert ours.value.response["Error"]["Code"] == "NoSuchBucket"
    assert ours.value.response["Error"]["Message"] == clients.value.response["Error"]["Message"]
    assert ours.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert str(ours.value) == str(clients.value)
    with pytest.raises(ClientError) as put_info:
        gone.put(DOC)
    assert str(put_info.value).startswith(
        "An error occurred (NoSuchBucket) when calling the PutObject operation")


@pytest.mark.parametrize(("status", "code"), [(503, "ServiceUnavailable"), (500, "InternalError"),
                                              (503, "SlowDown")])
def test_a_transient_refusal_is_retried(peer, status, code):
    store = peer_store(peer)
    peer.script = [(status, code)]
    stored = store.put(DOC)
    peer.script = [(status, code)]
    with store.open(stored.digest) as stream:
        assert stream.read() == DOC
    assert [(s.method, s.verified) for s in peer.seen] == [("PUT", True)] * 2 + [("GET", True)] * 2
    assert peer.objects[f"/{BUCKET}/payloads/{stored.digest}"] == DOC


def test_retries_stop_where_the_clients_stop(peer):
    store = peer_store(peer)
    peer.script = [(503, "ServiceUnavailable")] * 100
    with pytest.raises(ClientError) as client_info:
        store.client.put_object(Bucket=BUCKET, Key="payloads/by-client", Body=DOC)
    by_client = len(peer.seen)
    assert by_client == store.client.meta.config.retries["total_max_attempts"]

    with pytest.raises(ClientError) as ours:
        store.put(DOC)
    assert len(peer.seen) - by_client == by_client
    assert ours.value.response["Error"]["Code"] == "ServiceUnavailable"
    assert ours.value.response["ResponseMetadata"]["RetryAttempts"] == by_client - 1
    assert str(ours.value) == str(client_info.value)  # "(reached max retries: 5)" too
    with pytest.raises(ClientError):  # a refusal that is not transient: once
        peer.script = [(400, "InvalidRequest")]
        store.put(DOC)
    assert len(peer.seen) == 2 * by_client + 1


def test_an_unreachable_server_raises_the_clients_exception():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = S3PayloadStore(BUCKET, "payloads", endpoint_url=f"http://127.0.0.1:{port}",
                           client_options={"aws_access_key_id": "a",
                                           "aws_secret_access_key": "b"})
    with pytest.raises(EndpointConnectionError) as ours:
        store.put(DOC)
    with pytest.raises(EndpointConnectionError) as clients:
        store.client.put_object(Bucket=BUCKET, Key=store.key(sha(DOC)), Body=DOC)
    assert str(ours.value) == str(clients.value)
    with pytest.raises(EndpointConnectionError):
        store.open(sha(DOC))


@pytest.mark.parametrize(("region", "bucket", "url"), [
    ("us-east-1", "my-bucket", "https://my-bucket.s3.amazonaws.com/p/ab%20c~d"),
    ("eu-west-1", "my-bucket", "https://my-bucket.s3.eu-west-1.amazonaws.com/p/ab%20c~d"),
    ("eu-west-1", "my.dotted.bucket", "https://s3.eu-west-1.amazonaws.com/my.dotted.bucket/p/ab%20c~d"),
    ("us-east-1", "My_Bucket", "https://s3.amazonaws.com/My_Bucket/p/ab%20c~d"),
])
def test_aws_buckets_are_addressed_virtual_hosted_unless_their_name_cannot_be(
        region, bucket, url, monkeypatch):
    monkeypatch.setenv("AWS_REGION", region)
    store = S3PayloadStore(bucket, "p", client_options={
        "aws_access_key_id": "a", "aws_secret_access_key": "b"})
    assert store._lean_requests().url("p/ab c~d") == url
    seen = []

    class Stop(Exception):
        pass

    def stop(request, **_):  # where the client itself would send it, before any sending
        seen.append(request.url)
        raise Stop
    store.client.meta.events.register("before-sign.s3.GetObject", stop)
    with pytest.raises(Stop):
        store.client.get_object(Bucket=bucket, Key="p/ab c~d")
    assert seen == [url]


def test_an_endpoint_url_is_addressed_path_style():
    assert object_url("http://127.0.0.1:9000", "bucket", "p/k", path_style=True) == \
        "http://127.0.0.1:9000/bucket/p/k"
    assert object_url("https://minio.example:9000/base/", "bucket", "p/k", path_style=True) \
        == "https://minio.example:9000/base/bucket/p/k"


def test_a_proxy_leaves_the_requests_to_the_client(monkeypatch, s3_server):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    store = S3PayloadStore("b", "p", endpoint_url=s3_server.endpoint_url,
                           client_options={"aws_access_key_id": "a",
                                           "aws_secret_access_key": "b"})
    assert store._lean_requests() is None
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    store = S3PayloadStore("b", "p", endpoint_url=s3_server.endpoint_url,
                           client_options={"aws_access_key_id": "a",
                                           "aws_secret_access_key": "b"})
    assert store._lean_requests() is not None


def test_a_redirect_leaves_the_requests_to_the_client(peer):
    """S3 answers that the bucket is in another region: the client, which follows that,
    makes this request and the next ones."""
    store = peer_store(peer)
    peer.script = [(301, "PermanentRedirect")]
    calls = client_calls(store)
    stored = store.put(DOC)
    with store.open(stored.digest) as stream:
        assert stream.read() == DOC
    assert calls == ["PutObject", "GetObject"]
    assert [s.method for s in peer.seen] == ["PUT", "PUT", "GET"]


def test_a_forked_process_sends_over_a_pool_of_its_own(peer):
    store = peer_store(peer)
    stored = store.put(DOC)
    parent_pool = store._lean_requests().pool
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its GET, then whether it used the parent's pool
        try:
            with store.open(stored.digest) as stream:
                ok = stream.read() == DOC
            mine = store._lean_requests().pool
            os.write(write, f"{ok} {mine is parent_pool}".encode())
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    os.close(read)
    with store.open(stored.digest) as stream:  # the parent's connection, still its own
        assert stream.read() == DOC
    assert answer == "True False"
    ports = [s.port for s in peer.seen]
    assert ports[0] == ports[2] != ports[1]  # the child's GET on a connection of its own
    assert store._lean_requests().pool is parent_pool


def test_parallel_gets_share_the_pool(peer):
    store = peer_store(peer)
    stored = [store.put(DOC + bytes([n])) for n in range(8)]
    got = store.read_ahead({s.digest: s.size for s in stored})
    assert got == {s.digest: DOC + bytes([n]) for n, s in enumerate(stored)}
    assert [(s.method, s.problem) for s in peer.seen if not s.verified] == []
    # the parallel GETs came over at most the store's pool of connections, not one each
    assert len({seen.port for seen in peer.seen if seen.method == "GET"}) <= store.threads


def test_the_requests_of_every_batch_go_out_on_the_same_few_threads(peer):
    """A batch's PUTs (its commit) and GETs (a read-ahead) run on the process's pool of
    ``threads`` threads, kept from one batch to the next, not on threads started for
    each batch; a forked process gets threads of its own."""
    import threading

    store = peer_store(peer)
    store.threads = 4
    senders: list[tuple[str, int]] = []
    store.request_hooks.append(
        lambda operation, key: senders.append((operation, threading.get_ident())))
    for round_ in range(3):
        batch = store.batch()
        stored = [batch.put(DOC + bytes([round_, n])) for n in range(6)]
        batch.commit()
        assert store.read_ahead({s.digest: s.size for s in stored}) == {
            s.digest: DOC + bytes([round_, n]) for n, s in enumerate(stored)}
    assert [op for op, _ in senders] == (["PutObject"] * 6 + ["GetObject"] * 6) * 3
    used = {ident for _, ident in senders}
    assert len(used) <= 4
    named = {t.ident: t.name for t in threading.enumerate()}
    assert all(named.get(ident, "").startswith("s3-payloads") for ident in used)

    parent_pool = store._threads()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its batch's requests on threads of its own
        try:
            senders.clear()
            batch = store.batch()
            for n in range(3):
                batch.put(DOC + bytes([9, n]))
            batch.commit()
            own = store._threads()
            mine = {t.ident for t in own._threads}
            ok = (own is not parent_pool and senders
                  and {ident for _, ident in senders} <= mine)
            os.write(write, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 2) == b"ok"
    os.waitpid(child, 0)
