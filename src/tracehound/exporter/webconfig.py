"""`--web.config.file`: TLS and basic authentication in the file format of
the Prometheus exporter toolkit (node_exporter, dcgm-exporter and others),
so that a fleet reuses the files it has:

    tls_server_config:
      cert_file: /etc/tracehound/tls/tls.crt      # or cert: <PEM>
      key_file: /etc/tracehound/tls/tls.key       # or key: <PEM>
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: /etc/tracehound/tls/ca.crt  # or client_ca: <PEM>
      client_allowed_sans: [prometheus.example.com]
      min_version: TLS12                          # TLS10..TLS13
      max_version: TLS13
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
      http2: false                                # accepted; HTTP/1.1 is served
    basic_auth_users:
      prometheus: $2y$10$...                      # bcrypt

The file is read once, at start: any error (an unknown key, a file that
cannot be read or is no regular file, a certificate that does not match its
key) stops the agent
before anything is started. The certificate, key and client CA files are
read again when they change (tls_reload.py); the file itself (users,
headers, settings) takes a restart.
"""
from __future__ import annotations

import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass, field
from typing import Optional

import yaml

from ..regular_file import check_regular, read_regular
from .basic_auth import BasicAuth, check_hash
from .tls_reload import CertificateReloader

TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}
TLS_KEYS = {"cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type",
            "client_ca_file", "client_allowed_sans", "min_version", "max_version",
            "prefer_server_cipher_suites"}
HTTP_KEYS = {"http2", "headers"}
# the toolkit's own list: security headers only, never one that frames the protocol
HEADERS = {"content-security-policy": "Content-Security-Policy",
           "x-frame-options": "X-Frame-Options",
           "x-content-type-options": "X-Content-Type-Options",
           "x-xss-protection": "X-XSS-Protection",
           "strict-transport-security": "Strict-Transport-Security"}
VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
            "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# client_auth_type -> (verify mode, whether a client CA is needed). Python's
# ssl cannot ask for a certificate without verifying it: RequestClientCert,
# whose certificate is never used, is served as NoClientCert, and
# RequireAnyClientCert (any certificate, unverified) is refused.
CLIENT_AUTH = {"NoClientCert": (ssl.CERT_NONE, False),
               "RequestClientCert": (ssl.CERT_NONE, False),
               "VerifyClientCertIfGiven": (ssl.CERT_OPTIONAL, True),
               "RequireAndVerifyClientCert": (ssl.CERT_REQUIRED, True)}
# keys the toolkit has that this server cannot honour: refused, never ignored
UNSUPPORTED = {"cipher_suites": "Go cipher-suite names; OpenSSL's defaults are used",
               "curve_preferences": "Go curve names; OpenSSL's defaults are used",
               "rate_limit": "no rate limiter here",
               "RequireAnyClientCert": "Python's ssl verifies every certificate it asks "
                                       "for: use RequireAndVerifyClientCert with a "
                                       "client_ca_file"}


class WebConfigError(ValueError):
    """The file is not a web configuration this agent can serve."""


@dataclass
class WebConfig:
    path: str = ""
    tls: Optional[ssl.SSLContext] = None
    auth: Optional[BasicAuth] = None
    headers: tuple = ()
    allowed_sans: tuple = ()
    # rebuilds `tls` when its certificate, key or CA files change
    reloader: Optional[CertificateReloader] = None
    client_auth_type: str = "NoClientCert"
    notes: list = field(default_factory=list)

    @property
    def secure(self) -> bool:
        """TLS with authentication: basic auth, or verified client certificates."""
        return self.tls is not None and (
            self.auth is not None or self.client_auth_type == "RequireAndVerifyClientCert")

    def peer_allowed(self, sock: ssl.SSLSocket) -> bool:
        """client_allowed_sans: the client's certificate names one of them."""
        if not self.allowed_sans:
            return True
        cert = sock.getpeercert() or {}
        names = {value for _kind, value in cert.get("subjectAltName", ())}
        return bool(names & set(self.allowed_sans))


def load(path: str) -> WebConfig:
    """The web configuration at path, every part of it checked."""
    try:
        doc = yaml.safe_load(read_regular(path).decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise WebConfigError(f"cannot read it: {exc}") from None
    if doc is None:
        doc = {}
    base = os.path.dirname(os.path.abspath(path))
    _mapping(doc, "the file", TOP_KEYS)
    config = WebConfig(path=path)
    tls = doc.get("tls_server_config")
    if tls:
        _tls(config, _mapping(tls, "tls_server_config", TLS_KEYS), base)
    http = doc.get("http_server_config")
    if http:
        _http(config, _mapping(http, "http_server_config", HTTP_KEYS))
    users = doc.get("basic_auth_users")
    if users:
        users = _mapping(users, "basic_auth_users", None)
        for user, hashed in users.items():
            if not isinstance(user, str) or not isinstance(hashed, str) or \
                    not check_hash(hashed):
                raise WebConfigError(f"basic_auth_users: {user!r}: the password must be a "
                                     "bcrypt hash ($2a$, $2b$ or $2y$, e.g. from "
                                     "htpasswd -nBC 10 \"\" | tr -d ':\\n')")
        config.auth = BasicAuth(users)
    return config


def _mapping(value, where: str, keys: Optional[set]) -> dict:
    if not isinstance(value, dict):
        raise WebConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    if keys is not None:
        for key in value:
            if key in UNSUPPORTED:
                raise WebConfigError(f"{where}: {key} is not supported ({UNSUPPORTED[key]})")
            if key not in keys:
                raise WebConfigError(f"{where}: unknown key {key!r} (known: "
                                     f"{', '.join(sorted(keys))})")
    return value


def _text(section: dict, key: str, where: str) -> str:
    value = section.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise WebConfigError(f"{where}.{key}: expected a string")
    return value


def _tls(config: WebConfig, section: dict, base: str) -> None:
    where = "tls_server_config"
    get = {key: _text(section, key, where) for key in
           ("cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type",
            "client_ca_file", "min_version", "max_version")}
    for inline in ("cert", "key", "client_ca"):
        if get[inline] and get[f"{inline}_file"]:
            raise WebConfigError(f"{where}: {inline} and {inline}_file are both set")
    has_cert = bool(get["cert"] or get["cert_file"])
    if has_cert != bool(get["key"] or get["key_file"]):
        raise WebConfigError(f"{where}: a certificate needs its key (cert_file and key_file)")
    if not has_cert:
        # the toolkit's rule: no certificate, no TLS (plain HTTP, maybe basic auth)
        if any(get[k] for k in ("client_ca", "client_ca_file", "client_auth_type")):
            raise WebConfigError(f"{where}: client authentication needs cert_file and key_file")
        return
    auth_type = get["client_auth_type"] or "NoClientCert"
    if auth_type in UNSUPPORTED:
        raise WebConfigError(f"{where}.client_auth_type: {auth_type} is not supported "
                             f"({UNSUPPORTED[auth_type]})")
    if auth_type not in CLIENT_AUTH:
        raise WebConfigError(f"{where}.client_auth_type: unknown {auth_type!r} (known: "
                             f"{', '.join(CLIENT_AUTH)}, RequireAnyClientCert)")
    verify, needs_ca = CLIENT_AUTH[auth_type]
    has_ca = bool(get["client_ca"] or get["client_ca_file"])
    if needs_ca and not has_ca:
        raise WebConfigError(f"{where}: client_auth_type {auth_type} needs client_ca_file")
    if has_ca and not needs_ca:
        raise WebConfigError(f"{where}: client_ca_file is set but client_auth_type "
                             f"{auth_type} does not verify client certificates")
    sans = section.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(s, str) for s in sans):
        raise WebConfigError(f"{where}.client_allowed_sans: expected a list of strings")
    if sans and auth_type != "RequireAndVerifyClientCert":
        raise WebConfigError(f"{where}.client_allowed_sans needs client_auth_type "
                             "RequireAndVerifyClientCert")
    def make() -> ssl.SSLContext:
        return _context(get, base, verify, has_ca)

    config.tls = make()
    files = [_path(base, get[k]) for k in ("cert_file", "key_file", "client_ca_file") if get[k]]
    if files:
        config.reloader = CertificateReloader(make, files, config.tls)
    if auth_type == "RequestClientCert":
        config.notes.append("client_auth_type RequestClientCert is served as NoClientCert "
                            "(the certificate would not be used)")
    config.client_auth_type = auth_type
    config.allowed_sans = tuple(_san(s) for s in sans)


def _context(get: dict, base: str, verify, has_ca: bool) -> ssl.SSLContext:
    """A server context from the checked settings (at start, and again
    when the files change: tls_reload.py)."""
    where = "tls_server_config"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = get[key] or default
        if name not in VERSIONS:
            raise WebConfigError(f"{where}.{key}: unknown {name!r} (known: "
                                 f"{', '.join(VERSIONS)})")
        try:
            setattr(context, key.replace("_version", "imum_version"), VERSIONS[name])
        except (ValueError, ssl.SSLError) as exc:
            raise WebConfigError(f"{where}.{key}: {name}: {exc}") from None
    if context.minimum_version > context.maximum_version:
        raise WebConfigError(f"{where}: min_version is above max_version")
    _load_chain(context, get, base)
    if has_ca:
        try:
            if get["client_ca"]:
                context.load_verify_locations(cadata=get["client_ca"])
            else:
                context.load_verify_locations(
                    cafile=check_regular(_path(base, get["client_ca_file"])))
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"{where}.client_ca: cannot load it: {exc}") from None
    context.verify_mode = verify
    return context


def _san(value: str) -> str:
    # getpeercert() spells IPv6 addresses in full, upper case
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return value
    return address.exploded.upper() if address.version == 6 else str(address)


def _path(base: str, name: str) -> str:
    """A file named in the configuration, relative to the file's directory
    (the toolkit's rule)."""
    return os.path.join(base, name)


def _load_chain(context: ssl.SSLContext, get: dict, base: str) -> None:
    where = "tls_server_config"
    if get["cert_file"]:
        try:
            context.load_cert_chain(check_regular(_path(base, get["cert_file"])),
                                    check_regular(_path(base, get["key_file"]))
                                    if get["key_file"] else None)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"{where}: cannot load cert_file/key_file: {exc}") from None
        if get["key"]:
            raise WebConfigError(f"{where}: key with cert_file: use key_file")
        return
    if get["key_file"]:
        raise WebConfigError(f"{where}: cert with key_file: use cert_file")
    # inline PEM: ssl loads chains from files only; a private file for the
    # moment of loading
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as pem:
        os.chmod(pem.name, 0o600)
        pem.write(get["key"].strip() + "\n" + get["cert"].strip() + "\n")
        pem.flush()
        try:
            context.load_cert_chain(pem.name)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"{where}: cannot load cert/key: {exc}") from None


def _http(config: WebConfig, section: dict) -> None:
    where = "http_server_config"
    if "http2" in section:
        if not isinstance(section["http2"], bool):
            raise WebConfigError(f"{where}.http2: expected true or false")
        if section["http2"]:
            config.notes.append("http_server_config.http2 is accepted and ignored: "
                                "HTTP/1.1 is served")
    headers = section.get("headers") or {}
    if not isinstance(headers, dict):
        raise WebConfigError(f"{where}.headers: expected a mapping")
    out = []
    for name, value in headers.items():
        canonical = HEADERS.get(str(name).lower())
        if canonical is None:
            raise WebConfigError(f"{where}.headers: {name!r} cannot be set (allowed: "
                                 f"{', '.join(HEADERS.values())})")
        if not isinstance(value, str) or "\r" in value or "\n" in value:
            raise WebConfigError(f"{where}.headers.{name}: expected a one-line string")
        if value:
            out.append((canonical, value))
    config.headers = tuple(out)
