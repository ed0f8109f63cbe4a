"""TLS of the HTTP links: what the server hands uvicorn, the clients' SSL context, and the secrets' sources.

One module for both ends so that the server (``serve --tls-cert/--tls-key/--tls-client-ca``), the Python
clients (``ca_file``, ``cert``), the CLI (``--ca-file``, ``--client-cert``, ``--client-key``), the replica
link and ``backup --url`` read certificates the same way and fail with the same one-line messages.

Environment (read by the CLI and by the clients when no file is given, as libpq reads ``PGSSLROOTCERT``):
``DIFFSTORE_CA_FILE``, ``DIFFSTORE_CLIENT_CERT``, ``DIFFSTORE_CLIENT_KEY``.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from diffstore.errors import InvalidRequest

CA_FILE_ENV = "DIFFSTORE_CA_FILE"
CLIENT_CERT_ENV = "DIFFSTORE_CLIENT_CERT"
CLIENT_KEY_ENV = "DIFFSTORE_CLIENT_KEY"

CA_FILE_HELP = (
    "PEM file of the certificate authority that signed the server's certificate, for https:// URLs of a"
    f" server with a private CA (env {CA_FILE_ENV}; default: the system's authorities)"
)
CLIENT_CERT_HELP = (
    "PEM client certificate, for a server started with --tls-client-ca (with --client-key;"
    f" env {CLIENT_CERT_ENV})"
)
CLIENT_KEY_HELP = f"PEM private key of --client-cert (env {CLIENT_KEY_ENV})"


@dataclass(frozen=True, slots=True)
class ClientTls:
    """How a client checks the server and proves itself: a CA file and a (certificate, key) pair."""

    ca_file: str | None = None
    cert: tuple[str, str] | None = None

    @classmethod
    def resolve(
        cls,
        ca_file: str | None,
        cert: tuple[str, str] | None,
        environ: Mapping[str, str] | None = None,
    ) -> ClientTls:
        """The given files, else those of the environment (``environ``; None: no environment)."""
        env = environ or {}
        ca = ca_file if ca_file is not None else env.get(CA_FILE_ENV) or None
        if cert is None and env.get(CLIENT_CERT_ENV):
            cert = (env[CLIENT_CERT_ENV], env.get(CLIENT_KEY_ENV) or env[CLIENT_CERT_ENV])
        return cls(ca, cert)

    def context(self) -> ssl.SSLContext:
        """The client's SSL context (the system's authorities unless ``ca_file``).

        Raises:
            InvalidRequest: a file that cannot be read or is not PEM, named in one line.
        """
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidRequest(f"CA file {self.ca_file}: {_reason(exc)}") from exc
        if self.cert is not None:
            crt, key = self.cert
            try:
                context.load_cert_chain(crt, key)
            except (OSError, ssl.SSLError) as exc:
                raise InvalidRequest(f"client certificate {crt} (key {key}): {_reason(exc)}") from exc
        return context


def client_tls_from_args(args: Any) -> ClientTls:
    """The TLS files of a command with :func:`add_client_arguments` (its defaults come from the environment).

    Raises:
        InvalidRequest: ``--client-key`` without ``--client-cert``.
    """
    crt, key = getattr(args, "client_cert", None), getattr(args, "client_key", None)
    if key and not crt:
        raise InvalidRequest("--client-key needs --client-cert")
    return ClientTls(getattr(args, "ca_file", None) or None, (crt, key or crt) if crt else None)


def add_client_arguments(parser: Any) -> None:
    """``--ca-file``, ``--client-cert``, ``--client-key`` (defaults from the environment) on a parser."""
    parser.add_argument("--ca-file", metavar="F", default=os.environ.get(CA_FILE_ENV), help=CA_FILE_HELP)
    parser.add_argument(
        "--client-cert", metavar="F", default=os.environ.get(CLIENT_CERT_ENV), help=CLIENT_CERT_HELP
    )
    parser.add_argument(
        "--client-key", metavar="F", default=os.environ.get(CLIENT_KEY_ENV), help=CLIENT_KEY_HELP
    )


def uvicorn_options(cert: str | None, key: str | None, client_ca: str | None) -> dict[str, Any]:
    """uvicorn's ``ssl_*`` options for a server's files (none: plain HTTP)."""
    if cert is None:
        return {}
    options: dict[str, Any] = {"ssl_certfile": cert, "ssl_keyfile": key}
    if client_ca is not None:
        options.update(ssl_ca_certs=client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


def check_server_files(cert: str | None, key: str | None, client_ca: str | None) -> None:
    """Loads the server's files once, so that a bad one fails ``serve`` in one line before any worker starts.

    Raises:
        InvalidRequest: a missing half of the pair, or a file that cannot be read or is not PEM.
    """
    if (cert is None) != (key is None):
        raise InvalidRequest("--tls-cert and --tls-key go together")
    if client_ca is not None and cert is None:
        raise InvalidRequest("--tls-client-ca needs --tls-cert and --tls-key")
    if cert is None or key is None:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidRequest(f"--tls-cert {cert} / --tls-key {key}: {_reason(exc)}") from exc
    if client_ca is not None:
        try:
            context.load_verify_locations(client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidRequest(f"--tls-client-ca {client_ca}: {_reason(exc)}") from exc


def speaks_tls(url: str, timeout_s: float = 5.0) -> bool:
    """Whether the server of a plain ``http://`` URL answers a TLS handshake (it serves HTTPS only).

    Called after a plain request failed without an answer, to say so in one line instead of a reset.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        return False
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE  # only asks whether TLS is spoken; nothing is sent over it
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout_s) as raw:
            with probe.wrap_socket(raw, server_hostname=parts.hostname):
                return True
    except ssl.SSLError as exc:
        # a server that wants a client certificate may refuse the handshake after speaking TLS
        return "CERTIFICATE" in str(exc).upper() or "ALERT" in str(exc).upper()
    except OSError:
        return False


def asks_client_certificate(url: str, timeout_s: float = 2.0) -> bool:
    """Whether the server of an ``https://`` URL refuses a connection without a client certificate (started
    with ``--tls-client-ca``): probed with a request of ``/healthz`` over a connection showing none."""
    parts = urlsplit(url)
    if parts.scheme != "https" or parts.hostname is None:
        return False
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE  # only asks what the server wants; nothing secret is sent
    try:
        with socket.create_connection((parts.hostname, parts.port or 443), timeout=timeout_s) as raw:
            with probe.wrap_socket(raw, server_hostname=parts.hostname) as conn:
                conn.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
                return not conn.recv(1)  # TLS 1.3: the refusal comes as an alert on the first read
    except ssl.SSLError as exc:
        return "CERTIFICATE" in str(exc).upper()
    except OSError:
        return False


def explain(url: str, exc: BaseException) -> str | None:
    """One line that says what is wrong with a failed TLS exchange with the server at ``url`` (its base
    URL), or None when the failure is not about TLS (a refused connection, a timeout)."""
    text = str(exc)
    upper = text.upper()
    if "CERTIFICATE_VERIFY_FAILED" in upper:
        return (
            f"{url}: the server's certificate is not trusted ({text}): give the authority that signed it"
            " with --ca-file or DIFFSTORE_CA_FILE (ca_file= in Python)"
        )
    if url.startswith("https://") and any(
        sign in upper for sign in ("WRONG_VERSION_NUMBER", "RECORD LAYER FAILURE", "PACKET_LENGTH_TOO_LONG")
    ):
        plain = "http://" + url.split("://", 1)[1]
        return f"{url}: the server does not speak TLS: use {plain}"
    kind = type(exc).__name__
    # probed only after the server dropped a connection without an answer (not refused, not timed out)
    if url.startswith("https://") and kind in ("RemoteProtocolError", "ReadError", "ConnectError"):
        if "CERTIFICATE" in upper or (kind != "ConnectError" and asks_client_certificate(url)):
            return (
                f"{url}: the server refused the connection without a client certificate it trusts: give one"
                " signed by its --tls-client-ca with --client-cert and --client-key (or DIFFSTORE_CLIENT_CERT"
                " and DIFFSTORE_CLIENT_KEY; cert= in Python)"
            )
    if url.startswith("http://") and kind == "RemoteProtocolError" and speaks_tls(url, 2.0):
        return speaks_tls_message(url)
    return None


def speaks_tls_message(url: str) -> str:
    """The one line for a plain request refused by a TLS server."""
    https = "https://" + url.split("://", 1)[1] if "://" in url else url
    return f"{url}: the server speaks TLS (HTTPS) only: use {https} (with --ca-file for a private CA)"


def warn_secret_on_command_line(command: str, option: str, instead: str) -> None:
    """The one warning of a secret given as an argument: ``ps`` and ``/proc`` show it to every user."""
    print(
        f"{command}: warning: {option} can be read by every user of this machine (ps, /proc);"
        f" give it with {instead} instead",
        file=sys.stderr,
    )


def read_secret_file(path: str, option: str) -> str:
    """The one-line secret in file ``path`` (surrounding blanks and the final newline dropped).

    Raises:
        InvalidRequest: the file unreadable, empty, or of more than one line.
    """
    try:
        with open(path, encoding="utf-8") as file:
            secret = file.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidRequest(f"{option} {path}: {reason}") from exc
    if not secret or any(ch in secret for ch in "\r\n"):
        raise InvalidRequest(f"{option} {path} is empty or holds more than one line; give one token")
    return secret


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, ssl.SSLError):
        return exc.strerror
    return str(exc) or type(exc).__name__


TOKEN_FROM_FILE_HELP = (
    "read the bearer token from file F (one line), so that it is on no command line"
    " (--token-file is the scoped tokens' file)"
)


def add_token_arguments(parser: Any, token_help: str) -> None:
    """``--token T`` (which warns) and ``--token-from-file F`` on a parser; ``$DIFFSTORE_TOKEN`` is read by
    :func:`token_from_args`."""
    parser.add_argument("--token", metavar="T", default=None, help=token_help)
    parser.add_argument("--token-from-file", metavar="F", default=None, help=TOKEN_FROM_FILE_HELP)


def token_from_args(args: Any, command: str, environ: Mapping[str, str]) -> str | None:
    """The bearer token: ``--token-from-file F``, ``--token T`` (which warns once: every user of the machine
    can read a command line) or ``$DIFFSTORE_TOKEN``, in that order.

    Raises:
        InvalidRequest: both options given, the file unreadable, or the token empty.
    """
    given, path = getattr(args, "token", None), getattr(args, "token_from_file", None)
    if given is not None and path is not None:
        raise InvalidRequest("give --token-from-file or --token, not both")
    if path is not None:
        return read_secret_file(path, "--token-from-file")
    token: str
    if given is not None:
        token, source = str(given), "--token"
    else:
        found = environ.get("DIFFSTORE_TOKEN")
        if found is None:
            return None
        token, source = found, "DIFFSTORE_TOKEN"
    if not token.strip() or any(ch in token for ch in "\r\n"):
        raise InvalidRequest(f"{source} is empty or holds more than one line; give one token")
    if given is not None:  # warned once the token is known good: a refusal stays one line
        warn_secret_on_command_line(
            f"diffstore {command}", "--token", "--token-from-file F or DIFFSTORE_TOKEN"
        )
    return token


class TokenOnCommandLine(argparse.Action):
    """``--token T`` of a client command: kept, with the one warning that other users can read it."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: str | None = None) -> None:
        warn_secret_on_command_line(
            parser.prog.split()[-1], "--token", "--token-from-file F or DIFFSTORE_TOKEN"
        )
        setattr(namespace, self.dest, values)


class TokenFromFile(argparse.Action):
    """``--token-from-file F`` of a client command: the token read from F, as if given with ``--token``."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: str | None = None) -> None:
        try:
            setattr(namespace, self.dest, read_secret_file(str(values), "--token-from-file"))
        except InvalidRequest as exc:
            parser.error(exc.reason)


def add_client_token_arguments(parser: Any, token_help: str) -> None:
    """``--token`` (default ``$DIFFSTORE_TOKEN``; warns when given) and ``--token-from-file`` of a client
    command, both setting ``args.token``."""
    parser.add_argument(
        "--token",
        metavar="T",
        default=os.environ.get("DIFFSTORE_TOKEN"),
        action=TokenOnCommandLine,
        help=token_help,
    )
    parser.add_argument(
        "--token-from-file", metavar="F", dest="token", action=TokenFromFile, help=TOKEN_FROM_FILE_HELP
    )


def client_kwargs(args: Any) -> dict[str, Any]:
    """``ca_file`` and ``cert`` of :class:`diffstore.client.Client` from a command's options."""
    files = client_tls_from_args(args)
    return {"ca_file": files.ca_file, "cert": files.cert}
