"""Throwaway TLS material for the tests, made with `openssl`: a CA, a
server certificate for 127.0.0.1 and a client certificate, each valid for a
day, and web configuration files that use them."""
import os
import subprocess
from dataclasses import dataclass

import bcrypt
import yaml

PASSWORD = "scrape-me"
# the lowest bcrypt cost: the tests count checks, they do not need slow ones
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()


@dataclass
class TLSFiles:
    directory: str

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @property
    def ca(self) -> str:
        return self.path("ca.crt")

    def web_config(self, name: str, config: dict) -> str:
        path = self.path(name)
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        return path

    def tls_with_password(self, cert: str, user: str) -> tuple[str, str]:
        """An agent's web config serving TLS with CERT.crt/.key and basic
        authentication for `user`, and the file that holds its password."""
        config = self.web_config("web-config.yml", {
            "tls_server_config": {"cert_file": f"{cert}.crt", "key_file": f"{cert}.key"},
            "basic_auth_users": {user: HASH}})
        password = self.path("password")
        with open(password, "w") as f:
            f.write(PASSWORD)
        return config, password


def _openssl(directory: str, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True,
                   timeout=60)


def signed(directory: str, name: str, subject: str, extensions: str) -> None:
    """NAME.key and NAME.crt, signed by the CA in directory."""
    _openssl(directory, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
    with open(os.path.join(directory, f"{name}.ext"), "w") as f:
        f.write(extensions)
    _openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey",
             "ca.key", "-CAcreateserial", "-out", f"{name}.crt", "-days", "1", "-extfile",
             f"{name}.ext")


def make(directory: str) -> TLSFiles:
    """ca.crt/key, server.crt/key (IP 127.0.0.1) and client.crt/key
    (DNS prometheus.test), and other.crt/key from a CA nobody trusts."""
    directory = str(directory)
    _openssl(directory, "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "1", "-subj", "/CN=tracehound test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    signed(directory, "server", "/CN=127.0.0.1",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    signed(directory, "client", "/CN=prometheus.test",
            "subjectAltName=DNS:prometheus.test\nextendedKeyUsage=clientAuth\n")
    _openssl(directory, "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "other.key", "-out",
             "other.crt", "-days", "1", "-subj", "/CN=untrusted",
             "-addext", "subjectAltName=DNS:prometheus.test")
    return TLSFiles(directory)
