"""What the shipped deployments expose: none serves plain, unauthenticated
HTTP beyond its node. The image and the systemd unit listen on loopback by
default; the DaemonSet listens on the node's addresses only with the web
configuration from its Secret (TLS and a password), which the pod cannot
start without; Prometheus's example configurations scrape over TLS with a
password; and the example web configuration is refused until its password
hash is replaced."""
import os
import re
import shutil

import pytest
import yaml

from tests import tls_files
from tests.conftest import ROOT
from tests.unit.test_deploy_host import unit_options
from tests.unit.test_deploy_manifests import expand_env, one, run_parser
from tracehound.exporter.server import loopback, parse_listen
from tracehound.exporter.webconfig import WebConfigError, load

DEPLOY = os.path.join(ROOT, "deploy")
EXAMPLE = os.path.join(DEPLOY, "web-config", "web-config.yml")


def parsed_run(args):
    parser, _ = run_parser()
    return parser.parse_args(args)


def test_the_daemonset_serves_tls_with_a_password_from_its_secret():
    pod = one("DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: "192.0.2.10" for e in container["env"] if "valueFrom" in e}
    args = parsed_run([expand_env(a, env) for a in container["args"]])
    host, _ = parse_listen(args.listen)
    assert not loopback(host)          # scraped from elsewhere, so:
    config = args.web_config_file
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    mount = mounts[os.path.dirname(config)]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    # a Secret the pod cannot start without: never a plain fallback
    assert volume["secret"]["secretName"] and not volume["secret"].get("optional", False)


def test_the_service_monitor_and_the_scrape_example_use_tls_and_a_password():
    (endpoint,) = one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"]["key"] and endpoint["tlsConfig"]["serverName"]
    assert endpoint["basicAuth"]["password"]["key"]
    assert "insecureSkipVerify" not in endpoint["tlsConfig"]
    jobs = []
    for name in ("scrape.yml", "scrape-kubernetes.yml"):
        with open(os.path.join(DEPLOY, "prometheus", name)) as f:
            jobs += yaml.safe_load(f)["scrape_configs"]
    for job in jobs:
        assert job["scheme"] == "https", job["job_name"]
        assert job["tls_config"]["ca_file"] and "insecure_skip_verify" not in job["tls_config"]
        assert job["basic_auth"]["password_file"], job["job_name"]


def test_the_systemd_unit_and_the_image_listen_on_loopback_by_default():
    options = unit_options()
    (listen,) = [v.split("=", 1)[1] for v in options[("Service", "Environment")]
                 if v.startswith("TRACEHOUND_LISTEN=")]
    assert loopback(parse_listen(listen)[0])
    with open(os.path.join(DEPLOY, "image", "Dockerfile")) as f:
        cmd = re.search(r"^CMD (\[.*\])$", f.read(), re.M).group(1)
    args = parsed_run(yaml.safe_load(cmd))
    assert loopback(parse_listen(args.listen)[0]) and args.web_config_file is None


def test_the_example_web_config_is_refused_until_its_hash_is_set(tmp_path):
    tls = tls_files.make(tmp_path)
    shutil.copy(tls.path("server.crt"), tmp_path / "tls.crt")
    shutil.copy(tls.path("server.key"), tmp_path / "tls.key")
    with open(EXAMPLE) as f:
        text = f.read()
    shipped = tmp_path / "web-config.yml"
    shipped.write_text(text)
    with pytest.raises(WebConfigError, match="basic_auth_users: 'prometheus'"):
        load(str(shipped))
    shipped.write_text(text.replace("REPLACE-WITH-A-BCRYPT-HASH", tls_files.HASH))
    config = load(str(shipped))
    assert config.secure and config.auth.users.keys() == {"prometheus"}
