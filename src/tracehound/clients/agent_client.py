"""Reading an agent that serves TLS and basic authentication
(--web.config.file): what the chaos engine's detection probes and other
clients use to open an agent's URL. Set in the environment, so that no
password ever sits on a command line:

    TRACEHOUND_CA_FILE        CA that signed the agents' certificate (https URLs)
    TRACEHOUND_CERT_FILE      client certificate, for agents that require one,
    TRACEHOUND_KEY_FILE       and its key
    TRACEHOUND_USERNAME       basic-auth user,
    TRACEHOUND_PASSWORD_FILE  and the file that holds its password

Without them, https URLs are verified against the system's CAs (or
SSL_CERT_FILE) and no credentials are sent.

Which agent: every client (top, explain, health, the chaos examples) reads
the URL it is given, else TRACEHOUND_METRICS_URL, else the local agent's.
"""
from __future__ import annotations

import base64
import os
import ssl
import urllib.request
from typing import Mapping, Optional

from .. import defaults

URL_VARIABLE = "TRACEHOUND_METRICS_URL"
DEFAULT_METRICS_URL = f"http://{defaults.LISTEN}/metrics"


def metrics_url(given: Optional[str] = None, env: Mapping[str, str] = os.environ) -> str:
    """The agent's /metrics URL a client reads: `given`, else the variable,
    else the local agent's."""
    return given or env.get(URL_VARIABLE) or DEFAULT_METRICS_URL


def tls_context(env: Mapping[str, str] = os.environ) -> Optional[ssl.SSLContext]:
    """The context for https agent URLs; None: urllib's default."""
    ca, cert, key = (env.get(f"TRACEHOUND_{k}_FILE") for k in ("CA", "CERT", "KEY"))
    if not (ca or cert):
        return None
    context = ssl.create_default_context(cafile=ca or None)
    if cert:
        context.load_cert_chain(cert, key or None)
    return context


def auth_header(env: Mapping[str, str] = os.environ) -> Optional[str]:
    user, path = env.get("TRACEHOUND_USERNAME"), env.get("TRACEHOUND_PASSWORD_FILE")
    if not (user and path):
        return None
    with open(path, "rb") as f:
        password = f.read().rstrip(b"\r\n")
    return "Basic " + base64.b64encode(user.encode() + b":" + password).decode()


def open_agent(url: str, timeout: float, headers: Optional[dict] = None,
               env: Mapping[str, str] = os.environ):
    """urllib.request.urlopen of an agent's URL with the environment's TLS
    settings and credentials (credentials over https only: never sent in
    clear text)."""
    headers = dict(headers or {})
    context = None
    if url.lower().startswith("https:"):
        context = tls_context(env)
        auth = auth_header(env)
        if auth:
            headers["Authorization"] = auth
    request = urllib.request.Request(url, headers=headers)
    return urllib.request.urlopen(request, timeout=timeout, context=context)
