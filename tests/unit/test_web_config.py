"""`--web.config.file` (the Prometheus exporter toolkit's format): TLS,
basic authentication over every path, mutual TLS, response headers, a file
refused at start with its reason, and the warning for plain HTTP beyond
this host. Real TLS over 127.0.0.1, with certificates made by openssl."""
import base64
import http.client
import logging
import os
import shutil
import socket
import ssl
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry

from tests import tls_files
from tests.tls_files import HASH, PASSWORD
from tracehound.chaos.metrics import QueryError, fetch
from tracehound.exporter.events import EventLog
from tracehound.exporter.server import Exporter
from tracehound.exporter.webconfig import WebConfigError, load
from tracehound.top.source import MetricsSource, SourceError

from .waiting import DEADLINE_S

PATHS = {"/metrics": 200, "/healthz": 200, "/readyz": 200, "/events": 200, "/nowhere": 404}


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return tls_files.make(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def serve():
    started = []

    def start(web_config_path, listen="127.0.0.1:0"):
        exporter = Exporter(CollectorRegistry(), listen, {"/events": EventLog(4).wsgi},
                            web_config=load(web_config_path) if web_config_path else None)
        started.append(exporter.start())
        exporter.set_ready(True)
        return exporter
    yield start
    for exporter in started:
        exporter.stop()


def client_context(tls, cert=None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=tls.ca)
    if cert:
        context.load_cert_chain(tls.path(f"{cert}.crt"), tls.path(f"{cert}.key"))
    return context


def get(port, path, context, user=None, password=PASSWORD):
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=DEADLINE_S)
    headers = {}
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def auth_config(tls, **extra):
    config = {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
              "basic_auth_users": {"prometheus": HASH},
              "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}}}
    config.update(extra)
    return tls.web_config("auth.yml", config)


def test_every_path_needs_the_password_over_tls(tls, serve):
    exporter = serve(auth_config(tls))
    assert exporter.url.startswith("https://127.0.0.1:")
    context = client_context(tls)
    for path, status in PATHS.items():
        for user, password in ((None, PASSWORD), ("prometheus", "wrong"),
                               ("nobody", PASSWORD), ("prometheus", "x" * 100)):
            got, headers, _ = get(exporter.port, path, context, user, password)
            assert got == 401, (path, user, password)
            assert headers["WWW-Authenticate"].startswith("Basic ")
            assert headers["X-Content-Type-Options"] == "nosniff"
        got, headers, body = get(exporter.port, path, context, "prometheus")
        assert got == status, path
        assert headers["X-Content-Type-Options"] == "nosniff"
    # one bcrypt check per distinct (user, password), not per request
    assert exporter.web.auth.bcrypt_checks == 4


def test_plain_http_to_the_tls_port_gets_no_answer(tls, serve):
    exporter = serve(auth_config(tls))
    with socket.create_connection(("127.0.0.1", exporter.port), timeout=DEADLINE_S) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answer = sock.recv(4096)
        except ConnectionResetError:
            answer = b""
    # a TLS alert or nothing; no HTTP status line at all (a 401 would be one)
    assert not answer.startswith(b"HTTP"), answer[:100]


def mtls_config(tls, sans=None):
    section = {"cert_file": "server.crt", "key_file": "server.key",
               "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "ca.crt",
               "min_version": "TLS12"}
    if sans:
        section["client_allowed_sans"] = sans
    return tls.web_config("mtls.yml", {"tls_server_config": section})


def refused(port, context) -> bool:
    """The server ends the connection during or right after the handshake
    (TLS 1.3 reports a missing client certificate at the first read)."""
    try:
        status, _, _ = get(port, "/metrics", context)
    except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected):
        return True
    return status != 200


@pytest.mark.parametrize("sans", [None, ["prometheus.test"]])
def test_mutual_tls_takes_a_client_certificate_from_the_ca_only(tls, serve, sans):
    exporter = serve(mtls_config(tls, sans))
    assert get(exporter.port, "/metrics", client_context(tls, "client"))[0] == 200
    assert refused(exporter.port, client_context(tls))
    assert refused(exporter.port, client_context(tls, "other"))
    assert refused(exporter.port, client_context(tls, "server"))   # not a client certificate


def test_a_client_certificate_without_an_allowed_name_is_refused(tls, serve):
    exporter = serve(mtls_config(tls, ["someone.else"]))
    assert refused(exporter.port, client_context(tls, "client"))


@pytest.mark.parametrize("config,reason", [
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "ciphers": "x"}}, "unknown key 'ciphers'"),
    ({"basic_auth_user": {"a": HASH}}, "unknown key 'basic_auth_user'"),
    ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "server.key"}},
     "cannot load cert_file"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "client.key"}},
     "cannot load cert_file"),
    ({"tls_server_config": {"cert_file": "server.crt"}}, "needs its key"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "client_auth_type": "RequireAndVerifyClientCert"}},
     "needs client_ca_file"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "client_ca_file": "ca.crt"}}, "does not verify client"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "client_auth_type": "RequireAnyClientCert"}}, "not supported"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "client_auth_type": "Sometimes"}}, "unknown 'Sometimes'"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "min_version": "TLS14"}}, "unknown 'TLS14'"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "min_version": "TLS13", "max_version": "TLS12"}}, "above"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "cipher_suites": ["TLS_AES_128_GCM_SHA256"]}}, "not supported"),
    ({"basic_auth_users": {"prometheus": "plain-text-password"}}, "bcrypt hash"),
    ({"basic_auth_users": ["prometheus"]}, "expected a mapping"),
    ({"http_server_config": {"headers": {"Content-Length": "0"}}}, "cannot be set"),
    ({"http_server_config": {"headers": {"X-Frame-Options": "deny\r\nX-Evil: 1"}}},
     "one-line"),
    ({"http_server_config": {"http2": "yes"}}, "true or false"),
    ({"rate_limit": {"interval": "1s", "burst": 1}}, "not supported"),
    ("- a list", "expected a mapping"),
])
def test_bad_web_configs_are_refused_naming_the_problem(tls, config, reason):
    if isinstance(config, str):
        path = tls.path("bad.yml")
        with open(path, "w") as f:
            f.write(config)
    else:
        path = tls.web_config("bad.yml", config)
    with pytest.raises(WebConfigError, match=reason.replace("(", r"\(")):
        load(path)


def test_the_agent_refuses_a_bad_web_config_before_starting(tls):
    path = tls.web_config("typo.yml", {"tls_server_config": {"cert_file": "server.crt",
                                                             "key_fille": "server.key"}})
    agent = os.path.join(os.path.dirname(sys.executable), "tracehound")
    res = subprocess.run([agent, "run", "--listen", "127.0.0.1:0", "--web.config.file", path],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert path in res.stderr and "unknown key 'key_fille'" in res.stderr
    assert res.stdout == ""


def test_an_empty_file_and_inline_pem_are_accepted(tls, serve):
    empty = tls.path("empty.yml")
    open(empty, "w").close()
    assert load(empty).tls is None and load(empty).auth is None
    with open(tls.path("server.crt")) as c, open(tls.path("server.key")) as k:
        inline = tls.web_config("inline.yml", {"tls_server_config": {"cert": c.read(),
                                                                     "key": k.read()}})
    exporter = serve(inline)
    assert get(exporter.port, "/healthz", client_context(tls))[0] == 200


def test_plain_http_beyond_this_host_is_warned_about(tls, serve, caplog):
    caplog.set_level(logging.WARNING, logger="tracehound.exporter.server")
    serve(None)                                  # 127.0.0.1: this node only
    assert caplog.records == []
    serve(auth_config(tls), listen="0.0.0.0:0")  # TLS and a password
    assert caplog.records == []
    serve(None, listen="0.0.0.0:0")
    (record,) = caplog.records
    assert "without TLS or authentication" in record.getMessage()


def _chaos_probe(url):
    return "tracehound_scrape_samples" in fetch(url, DEADLINE_S)


def _top(url):
    return MetricsSource(url, DEADLINE_S).scrape() is not None


@pytest.mark.parametrize("read, refused", [(_chaos_probe, QueryError), (_top, SourceError)],
                         ids=["chaos-probe", "top"])
def test_readers_of_an_agent_take_its_tls_and_password_from_the_environment(
        tls, serve, monkeypatch, tmp_path, read, refused):
    exporter = serve(auth_config(tls))
    for name in ("CA_FILE", "CERT_FILE", "KEY_FILE", "USERNAME", "PASSWORD_FILE"):
        monkeypatch.delenv(f"TRACEHOUND_{name}", raising=False)
    monkeypatch.setenv("TRACEHOUND_CA_FILE", tls.ca)
    with pytest.raises(refused, match="Unauthorized|401"):
        read(exporter.url)
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    monkeypatch.setenv("TRACEHOUND_USERNAME", "prometheus")
    monkeypatch.setenv("TRACEHOUND_PASSWORD_FILE", str(secret))
    assert read(exporter.url)


def served_serial(port, context) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as raw_sock:
        with context.wrap_socket(raw_sock, server_hostname="127.0.0.1") as sock:
            return sock.getpeercert()["serialNumber"]


def replace(tls, source: str, target: str) -> None:
    """Swap a file in whole, as a renewal does (a rename, never a partial write)."""
    shutil.copy(tls.path(source), tls.path(target + ".new"))
    os.replace(tls.path(target + ".new"), tls.path(target))


def test_a_renewed_certificate_is_served_without_a_restart(tls, serve, caplog):
    replace(tls, "server.crt", "live.crt")
    replace(tls, "server.key", "live.key")
    path = tls.web_config("live.yml", {"tls_server_config": {"cert_file": "live.crt",
                                                             "key_file": "live.key"}})
    exporter = serve(path)
    context = client_context(tls)
    first = served_serial(exporter.port, context)
    tls_files.signed(tls.directory, "renewed", "/CN=127.0.0.1",
                     "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    # a broken certificate: the one in use stays
    with open(tls.path("broken.crt"), "w") as f:
        f.write("-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n")
    replace(tls, "broken.crt", "live.crt")
    assert served_serial(exporter.port, context) == first
    assert "do not load" in caplog.text
    # the renewal lands: key first, then certificate
    replace(tls, "renewed.key", "live.key")
    replace(tls, "renewed.crt", "live.crt")
    renewed = served_serial(exporter.port, context)
    assert renewed != first
    assert get(exporter.port, "/healthz", context)[0] == 200
    assert exporter.web.reloader.reloads == 1
