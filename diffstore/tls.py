"""TLS of the HTTP links: what the server hands uvicorn, the clients' SSL context, and the secrets' sources.

One module for both ends so that the server (``serve --tls-cert/--tls-key/--tls-client-ca``), the Python
clients (``ca_file``, ``cert``), the CLI (``--ca-file``, ``--client-cert``, ``--client-key``), the replica
link and ``backup --url`` read certificates the same way and fail with the same one-line messages.

Environment (read by the CLI and by the clients when no file is given, as libpq reads ``PGSSLROOTCERT``):
``DIFFSTORE_CA_FILE``, ``DIFFSTORE_CLIENT_CERT``, ``DIFFSTORE_CLIENT_KEY``, ``DIFFSTORE_CLIENT_KEY_PASSWORD``
(the passphrase of an encrypted client key) and, for ``serve``, ``DIFFSTORE_TLS_KEY_PASSWORD``.

:class:`ShippedTls` carries the same files' contents to processes that cannot read them (Spark's
executors): read where the paths exist, written to a private temporary directory just long enough for
the SSL context to load them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from diffstore.errors import InvalidRequest

CA_FILE_ENV = "DIFFSTORE_CA_FILE"
CLIENT_CERT_ENV = "DIFFSTORE_CLIENT_CERT"
CLIENT_KEY_ENV = "DIFFSTORE_CLIENT_KEY"
CLIENT_KEY_PASSWORD_ENV = "DIFFSTORE_CLIENT_KEY_PASSWORD"
SERVER_KEY_PASSWORD_ENV = "DIFFSTORE_TLS_KEY_PASSWORD"

CA_FILE_HELP = (
    "PEM file of the certificate authority that signed the server's certificate, for https:// URLs of a"
    f" server with a private CA (env {CA_FILE_ENV}; default: the system's authorities)"
)
CertFiles = tuple[str, str] | tuple[str, str, str]
"""A client certificate: (certificate, key) PEM files, or httpx's (certificate, key, key passphrase)."""

CLIENT_CERT_HELP = (
    "PEM client certificate, for a server started with --tls-client-ca (with --client-key;"
    f" env {CLIENT_CERT_ENV})"
)
CLIENT_KEY_HELP = f"PEM private key of --client-cert (env {CLIENT_KEY_ENV})"
CLIENT_KEY_PASSWORD_FILE_HELP = (
    f"file holding the passphrase of an encrypted --client-key on one line (env {CLIENT_KEY_PASSWORD_ENV})"
)


@dataclass(frozen=True, slots=True)
class ClientTls:
    """How a client checks the server and proves itself: a CA file and a (certificate, key) pair."""

    ca_file: str | None = None
    cert: tuple[str, str] | None = None
    key_password: str | None = field(default=None, repr=False)

    @classmethod
    def resolve(
        cls,
        ca_file: str | None,
        cert: CertFiles | None,
        environ: Mapping[str, str] | None = None,
    ) -> ClientTls:
        """The given files, else those of the environment (``environ``; None: no environment).

        ``cert`` may be httpx's ``(certificate, key, passphrase)``; without a passphrase there, an
        encrypted key's comes from ``DIFFSTORE_CLIENT_KEY_PASSWORD``.
        """
        env = environ or {}
        ca = ca_file if ca_file is not None else env.get(CA_FILE_ENV) or None
        password = env.get(CLIENT_KEY_PASSWORD_ENV) or None
        pair: tuple[str, str] | None = None
        if cert is not None:
            pair = (cert[0], cert[1])
            if len(cert) == 3:
                password = cert[2]
        elif env.get(CLIENT_CERT_ENV):
            pair = (env[CLIENT_CERT_ENV], env.get(CLIENT_KEY_ENV) or env[CLIENT_CERT_ENV])
        return cls(ca, pair, password if pair is not None else None)

    def client_kwargs(self) -> dict[str, Any]:
        """``ca_file`` and ``cert`` of :class:`diffstore.client.Client` (the passphrase in ``cert``)."""
        cert: CertFiles | None = self.cert
        if self.cert is not None and self.key_password is not None:
            cert = (*self.cert, self.key_password)
        return {"ca_file": self.ca_file, "cert": cert}

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
                context.load_cert_chain(crt, key, password=_no_prompt(self.key_password))
            except (OSError, ssl.SSLError) as exc:
                raise InvalidRequest(
                    f"client certificate {crt} (key {key}): "
                    f"{_key_reason(exc, key, f'--client-key-password-file or {CLIENT_KEY_PASSWORD_ENV}')}"
                ) from exc
        return context


def client_tls_from_args(args: Any, environ: Mapping[str, str] | None = None) -> ClientTls:
    """The TLS files of a command with :func:`add_client_arguments` (its defaults come from the environment);
    an encrypted key's passphrase from ``--client-key-password-file`` or ``$DIFFSTORE_CLIENT_KEY_PASSWORD``.

    Raises:
        InvalidRequest: ``--client-key`` without ``--client-cert``, or a passphrase file that cannot be read.
    """
    crt, key = getattr(args, "client_cert", None), getattr(args, "client_key", None)
    if key and not crt:
        raise InvalidRequest("--client-key needs --client-cert")
    password = secret_from(
        None,
        getattr(args, "client_key_password_file", None),
        CLIENT_KEY_PASSWORD_ENV,
        ("", "--client-key-password-file"),
        os.environ if environ is None else environ,
    )
    pair = (crt, key or crt) if crt else None
    return ClientTls(getattr(args, "ca_file", None) or None, pair, password if pair else None)


def add_client_arguments(parser: Any) -> None:
    """``--ca-file``, ``--client-cert``, ``--client-key`` (defaults from the environment) and
    ``--client-key-password-file`` on a parser."""
    parser.add_argument("--ca-file", metavar="F", default=os.environ.get(CA_FILE_ENV), help=CA_FILE_HELP)
    parser.add_argument(
        "--client-cert", metavar="F", default=os.environ.get(CLIENT_CERT_ENV), help=CLIENT_CERT_HELP
    )
    parser.add_argument(
        "--client-key", metavar="F", default=os.environ.get(CLIENT_KEY_ENV), help=CLIENT_KEY_HELP
    )
    parser.add_argument(
        "--client-key-password-file", metavar="F", default=None, help=CLIENT_KEY_PASSWORD_FILE_HELP
    )


def uvicorn_options(
    cert: str | None, key: str | None, client_ca: str | None, key_password: str | None = None
) -> dict[str, Any]:
    """uvicorn's ``ssl_*`` options for a server's files (none: plain HTTP)."""
    if cert is None:
        return {}
    options: dict[str, Any] = {"ssl_certfile": cert, "ssl_keyfile": key}
    if key_password is not None:
        options["ssl_keyfile_password"] = key_password
    if client_ca is not None:
        options.update(ssl_ca_certs=client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


def check_server_files(
    cert: str | None, key: str | None, client_ca: str | None, key_password: str | None = None
) -> None:
    """Loads the server's files once, so that a bad one fails ``serve`` in one line before any worker starts.

    Raises:
        InvalidRequest: a missing half of the pair, a file that cannot be read or is not PEM, or an
            encrypted key without its passphrase (or with a wrong one).
    """
    if (cert is None) != (key is None):
        raise InvalidRequest("--tls-cert and --tls-key go together")
    if client_ca is not None and cert is None:
        raise InvalidRequest("--tls-client-ca needs --tls-cert and --tls-key")
    if key_password is not None and cert is None:
        raise InvalidRequest("a TLS key passphrase needs --tls-cert and --tls-key")
    if cert is None or key is None:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=_no_prompt(key_password))
    except (OSError, ssl.SSLError) as exc:
        reason = _key_reason(exc, key, f"--tls-key-password-file or {SERVER_KEY_PASSWORD_ENV}")
        raise InvalidRequest(f"--tls-cert {cert} / --tls-key {key}: {reason}") from exc
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


def read_secret_file(path: str, option: str, what: str = "token") -> str:
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
        raise InvalidRequest(f"{option} {path} is empty or holds more than one line; give one {what}")
    return secret


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, ssl.SSLError):
        return exc.strerror
    return str(exc) or type(exc).__name__


def _no_prompt(password: str | None) -> Any:
    """``load_cert_chain``'s password: without one, an encrypted key fails instead of OpenSSL asking for
    its passphrase on the terminal (a server or a Spark task has nobody to answer)."""
    return password if password is not None else (lambda: b"")


def _key_reason(exc: BaseException, key: str, where: str) -> str:
    """Why a certificate and key did not load; for an encrypted key, where its passphrase is given (OpenSSL
    only says "PEM lib")."""
    text = _reason(exc)
    if isinstance(exc, ssl.SSLError) and _encrypted(key):
        return f"the key is encrypted and its passphrase is missing or wrong (give it with {where}): {text}"
    return text


def _encrypted(key: str) -> bool:
    """Whether PEM file ``key`` holds an encrypted private key (PKCS#8's or the traditional header)."""
    try:
        with open(key, "rb") as file:
            head = file.read(1 << 16)
    except OSError:
        return False
    return b"BEGIN ENCRYPTED PRIVATE KEY" in head or b"Proc-Type: 4,ENCRYPTED" in head


def key_pem(key: str, password: str | None, where: str) -> bytes:
    """The PEM bytes of private key file ``key``; an encrypted one decrypted in memory with ``password``
    by the ``openssl`` command (gRPC, the streams server's TLS, reads no encrypted key; the clear key never
    touches the disk).

    Raises:
        InvalidRequest: the file unreadable, or an encrypted key without its passphrase, with a wrong one,
            or without the ``openssl`` command.
    """
    try:
        with open(key, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise InvalidRequest(f"--tls-key {key}: {_reason(exc)}") from exc
    if not _encrypted(key):
        return data
    if password is None:
        raise InvalidRequest(f"--tls-key {key}: the key is encrypted: give its passphrase with {where}")
    openssl = shutil.which("openssl")
    if openssl is None:
        raise InvalidRequest(
            f"--tls-key {key}: an encrypted key needs the openssl command to be decrypted (not on PATH)"
        )
    done = subprocess.run(
        [openssl, "pkey", "-in", key, "-passin", "stdin"],
        input=password.encode() + b"\n",
        capture_output=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise InvalidRequest(
            f"--tls-key {key}: the key is encrypted and its passphrase is wrong (given with {where})"
        )
    return done.stdout


def secret_from(
    given: str | None,
    path: str | None,
    env_name: str,
    options: tuple[str, str],
    environ: Mapping[str, str],
    command: str = "diffstore",
) -> str | None:
    """A secret from file ``path``, the command line (``given``, which warns once: every user of the
    machine can read a command line) or ``environ[env_name]``, in that order; None when none is set.

    Args:
        options: the command-line option's name and the file option's (for the messages).

    Raises:
        InvalidRequest: both ``given`` and ``path``, the file unreadable, or the secret empty.
    """
    option, file_option = options
    if given is not None and path is not None:
        raise InvalidRequest(f"give {file_option} or {option}, not both")
    if path is not None:
        return read_secret_file(path, file_option, "secret")
    if given is not None:
        if not given:
            raise InvalidRequest(f"{option} is empty")
        warn_secret_on_command_line(command, option, f"{file_option} F or {env_name}")
        return given
    found = environ.get(env_name)
    if found is not None and not found:
        raise InvalidRequest(f"{env_name} is empty")
    return found


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
    return client_tls_from_args(args).client_kwargs()


@dataclass(frozen=True, slots=True)
class ShippedTls:
    """A client's TLS files by content, for processes where their paths do not exist (Spark's executors):
    read once where they do (:meth:`read`, on Spark's driver), pickled with the task, and written to a
    private directory only while a client loads them (:meth:`files`)."""

    # none in a repr: the key is a secret, the certificates only noise in a log line
    ca_pem: str | None = field(default=None, repr=False)
    cert_pem: str | None = field(default=None, repr=False)
    key_pem: str | None = field(default=None, repr=False)
    key_password: str | None = field(default=None, repr=False)

    @classmethod
    def read(cls, files: ClientTls) -> ShippedTls | None:
        """The contents of ``files`` (None when it names none).

        Raises:
            InvalidRequest: a file that cannot be read, named in one line.
        """
        if files.ca_file is None and files.cert is None:
            return None
        crt, key = files.cert if files.cert is not None else (None, None)
        return cls(_text(files.ca_file), _text(crt), _text(key), files.key_password)

    @contextmanager
    def files(self) -> Iterator[ClientTls]:
        """The files, written (mode 0600, in a directory only this user can enter) for the block only: a
        client loads them when it is built, so none outlives the block."""
        directory = tempfile.mkdtemp(prefix="diffstore-tls-")
        try:

            def written(name: str, text: str | None) -> str | None:
                if text is None:
                    return None
                path = os.path.join(directory, name)
                with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
                    file.write(text)
                return path

            ca, crt, key = written("ca.pem", self.ca_pem), written("cert.pem", self.cert_pem), None
            if crt is not None:
                key = written("key.pem", self.key_pem) or crt
            yield ClientTls(ca, (crt, key) if crt and key else None, self.key_password)
        finally:
            shutil.rmtree(directory, ignore_errors=True)


def _text(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="ascii") as file:
            return file.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"TLS file {path}: {_reason(exc)}") from exc
