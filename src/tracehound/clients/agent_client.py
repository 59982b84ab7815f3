"""Reading an agent that serves TLS and basic authentication
(--web.config.file): what the chaos engine's detection probes and other
clients use to open an agent's URL. Set in the environment, so that no
password ever sits on a command line:

    TRACEHOUND_CA_FILE        CA that signed the agents' certificate (https URLs)
    TRACEHOUND_CERT_FILE      client certificate, for agents that require one,
    TRACEHOUND_KEY_FILE       and its key
    TRACEHOUND_USERNAME       basic-auth user,
    TRACEHOUND_PASSWORD_FILE  and the file that holds its password

    TRACEHOUND_SERVER_NAME    the name the agent's certificate must carry, where
                              it is not the URL's host (one certificate named
                              `tracehound` for every agent, read at 127.0.0.1)

Without them, https URLs are verified against the system's CAs (or
SSL_CERT_FILE) and no credentials are sent.

Which agent: every client (top, explain, the chaos examples) reads the URL
it is given, else TRACEHOUND_METRICS_URL, else the local agent's: its
root-only local channel (`unix:/run/tracehound/default.sock/metrics`) where
this process is root and the channel is there and root's, else
http://127.0.0.1:9560/metrics. A `unix:` URL names the socket (the path up
to the component ending in `.sock`) and, after it, the HTTP path.
"""
from __future__ import annotations

import base64
import io
import os
import re
import ssl
import time
import urllib.error
import urllib.request
from typing import Mapping, Optional

from .. import defaults
from ..regular_file import read_regular
from .local_agent import LocalAgentError, check_socket, read_local, socket_path

URL_VARIABLE = "TRACEHOUND_METRICS_URL"
DEFAULT_METRICS_URL = f"http://{defaults.LISTEN}/metrics"
LOCAL_SCHEME = "unix:"
SOCKET_SUFFIX = ".sock"
# the socket: up to the first path component ending in .sock; then the target
_LOCAL_URL = re.compile(r"(/.*?\.sock)(?=/|\?|$)(.*)", re.S)


def local_metrics_url(instance: str = defaults.INSTANCE) -> Optional[str]:
    """The local channel's /metrics URL where this process may trust it."""
    path = socket_path(instance)
    if os.geteuid() != 0:
        return None
    try:
        check_socket(path)
    except LocalAgentError:
        return None
    return f"{LOCAL_SCHEME}{path}/metrics"


def metrics_url(given: Optional[str] = None, env: Mapping[str, str] = os.environ) -> str:
    """The agent's /metrics URL a client reads: `given`, else the variable,
    else the local agent's (its local channel where it can be used)."""
    return given or env.get(URL_VARIABLE) or local_metrics_url() or DEFAULT_METRICS_URL


def split_local(url: str) -> Optional[tuple[str, str]]:
    """(socket path, HTTP path and query) of a unix: URL, None for another."""
    if not url.startswith(LOCAL_SCHEME):
        return None
    m = _LOCAL_URL.fullmatch(url[len(LOCAL_SCHEME):])
    if m is None:
        raise ValueError(f"{url!r}: a unix: URL names a socket ending in {SOCKET_SUFFIX}")
    return m.group(1), m.group(2) or "/"


class _LocalResponse(io.BytesIO):
    """A local channel's whole answer, read like urllib's response."""
    status = 200
    headers: dict = {}


def tls_context(env: Mapping[str, str] = os.environ) -> Optional[ssl.SSLContext]:
    """The context for https agent URLs; None: urllib's default."""
    ca, cert, key = (env.get(f"TRACEHOUND_{k}_FILE") for k in ("CA", "CERT", "KEY"))
    name = env.get("TRACEHOUND_SERVER_NAME")
    if not (ca or cert or name):
        return None
    # what ssl.create_default_context makes, of the class that can rename
    context = (_NamedContext if name else ssl.SSLContext)(ssl.PROTOCOL_TLS_CLIENT)
    if ca:
        context.load_verify_locations(ca)
    else:
        context.load_default_certs()
    if name:
        context.server_name = name
    if cert:
        context.load_cert_chain(cert, key or None)
    return context


class _NamedContext(ssl.SSLContext):
    """Checks the agent's certificate for `server_name`, whatever host the
    URL names (Prometheus's tls_config.server_name, for local clients)."""
    server_name: Optional[str] = None

    def wrap_socket(self, sock, *args, server_hostname=None, **kw):
        return super().wrap_socket(sock, *args, server_hostname=self.server_name or
                                   server_hostname, **kw)


def auth_header(env: Mapping[str, str] = os.environ) -> Optional[str]:
    user, path = env.get("TRACEHOUND_USERNAME"), env.get("TRACEHOUND_PASSWORD_FILE")
    if not (user and path):
        return None
    password = read_regular(path).rstrip(b"\r\n")
    return "Basic " + base64.b64encode(user.encode() + b":" + password).decode()


# the most of an agent's answer a client reads: a busy node's whole
# exposition is a few MB; an endless or a one-line answer stops here
MAX_ANSWER_BYTES = 64 << 20


class AnswerError(OSError):
    """An agent's answer past its bound, in bytes or in time."""


def read_agent(url: str, timeout: float, headers: Optional[dict] = None,
               limit: int = MAX_ANSWER_BYTES, env: Mapping[str, str] = os.environ) -> bytes:
    """The body of an agent's answer (open_agent), at most LIMIT bytes and
    whole within TIMEOUT seconds from the start: an endless, a huge or a
    trickling answer is an AnswerError, never a client that grows or waits
    without end. Each read waits at most TIMEOUT too, so the whole takes at
    most twice that."""
    deadline = time.monotonic() + timeout
    chunks, size = [], 0
    with open_agent(url, timeout, headers, env) as resp:
        while True:
            chunk = resp.read1(1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise AnswerError(f"{url}: the answer exceeds {limit >> 20} MiB")
            chunks.append(chunk)
            if time.monotonic() > deadline:
                raise AnswerError(f"{url}: no whole answer within {timeout:g} s")
    return b"".join(chunks)


def open_agent(url: str, timeout: float, headers: Optional[dict] = None,
               env: Mapping[str, str] = os.environ):
    """urllib.request.urlopen of an agent's URL with the environment's TLS
    settings and credentials (credentials over https only: never sent in
    clear text); a unix: URL is read on the local channel, its failures
    raised as urllib.error.URLError with the cause."""
    local = split_local(url)
    if local is not None:
        try:
            return _LocalResponse(read_local(*local, timeout))
        except LocalAgentError as exc:
            raise urllib.error.URLError(str(exc)) from None
    headers = dict(headers or {})
    context = None
    if url.lower().startswith("https:"):
        context = tls_context(env)
        auth = auth_header(env)
        if auth:
            headers["Authorization"] = auth
    request = urllib.request.Request(url, headers=headers)
    return urllib.request.urlopen(request, timeout=timeout, context=context)
