"""A real Prometheus (Debian's) scrapes the agent's exporter over TLS, as a
fleet would with `--web.config.file`: with basic authentication (the right
password is up, a wrong one or none is down with 401), and with mutual TLS
(a client certificate from the CA is up, none is down). Certificates are
made by openssl for the test; every address is 127.0.0.1."""
import json
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from testbed import prometheus as prometheus_server
from tests import tls_files
from tests.tls_files import HASH, PASSWORD
from tracehound.exporter.server import Exporter
from tracehound.exporter.webconfig import load
from tracehound.clients.prometheus import query, wait_for

DEADLINE = 60


class Marker:
    def collect(self):
        fam = GaugeMetricFamily("tls_test_marker", "Scraped over TLS.")
        fam.add_metric([], 42.0)
        yield fam


def exporter(web_config_path) -> Exporter:
    registry = CollectorRegistry()
    registry.register(Marker())
    started = Exporter(registry, "127.0.0.1:0", web_config=load(web_config_path)).start()
    started.set_ready(True)
    return started


def job(name, port, tls, **extra) -> dict:
    return {"job_name": name, "scheme": "https",
            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
            "tls_config": {"ca_file": tls.ca, **extra.pop("tls_config", {})}, **extra}


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """Prometheus scraping two exporters with five jobs; yields its URL and
    the two exporters once every job has been scraped at least once."""
    tls = tls_files.make(tmp_path_factory.mktemp("tls"))
    server = {"cert_file": "server.crt", "key_file": "server.key"}
    password = exporter(tls.web_config("password.yml", {"tls_server_config": server,
                                                        "basic_auth_users": {"prom": HASH}}))
    mutual = exporter(tls.web_config("mutual.yml", {"tls_server_config": {
        **server, "client_auth_type": "RequireAndVerifyClientCert",
        "client_ca_file": "ca.crt"}}))
    client = {"cert_file": tls.path("client.crt"), "key_file": tls.path("client.key")}
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [
                  job("password", password.port, tls,
                      basic_auth={"username": "prom", "password": PASSWORD}),
                  job("wrong-password", password.port, tls,
                      basic_auth={"username": "prom", "password": "not it"}),
                  job("no-password", password.port, tls),
                  job("client-cert", mutual.port, tls, tls_config=client),
                  job("no-client-cert", mutual.port, tls)]}
    try:
        with prometheus_server.serving(tmp_path_factory.mktemp("prometheus"), config) as url:
            wait_for(url, "count(count_over_time(up[1m])) == 5", timeout=DEADLINE)
            yield url
    finally:
        password.stop()
        mutual.stop()


def up(url: str, job_name: str) -> float:
    (sample,) = query(url, f'up{{job="{job_name}"}}')
    return sample.value


def test_the_right_password_over_tls_is_up(scraped):
    wait_for(scraped, 'tls_test_marker{job="password"} == 42', timeout=DEADLINE)
    assert up(scraped, "password") == 1


@pytest.mark.parametrize("job_name", ["wrong-password", "no-password"])
def test_a_wrong_or_missing_password_is_down(scraped, job_name):
    assert up(scraped, job_name) == 0
    assert query(scraped, f'tls_test_marker{{job="{job_name}"}}') == []


def test_a_client_certificate_from_the_ca_is_up_and_none_is_down(scraped):
    wait_for(scraped, 'tls_test_marker{job="client-cert"} == 42', timeout=DEADLINE)
    assert up(scraped, "client-cert") == 1
    assert up(scraped, "no-client-cert") == 0


def test_prometheus_says_why_the_password_jobs_are_down(scraped):
    with urllib.request.urlopen(f"{scraped}/api/v1/targets", timeout=DEADLINE) as resp:
        targets = json.load(resp)["data"]["activeTargets"]
    errors = {t["labels"]["job"]: t["lastError"] for t in targets}
    assert "401" in errors["wrong-password"] and "401" in errors["no-password"]
    assert errors["password"] == "" and errors["client-cert"] == ""
    assert errors["no-client-cert"] != ""
