"""ggml's RPC backend from Python: a server in a process of its own, and the handshake
pyggml makes with a server before ggml-rpc connects to it.

ggml's RPC backend (``GGML_RPC``) keeps a backend's memory and computes in another process,
reached over TCP: ggml's way to spread a model over several machines (llama.cpp's
``rpc-server``). ``RPCServer`` starts one (``ggml_backend_rpc_start_server`` over a device of
this build, in ``python -m pyggml.rpc``), and ``pyggml.Backend("RPC", endpoint=server.endpoint)``
is a backend whose buffers live there::

    with pyggml.rpc.RPCServer() as server:
        rpc = pyggml.Backend("RPC", endpoint=server.endpoint)

On another machine, ``python -m pyggml.rpc --host 0.0.0.0 --port 50052`` serves its CPU (the
protocol has no authentication: serve on a trusted network only, as ggml's own server says).

ggml-rpc aborts the process when it cannot reach or parse a server, and waits for ever for
one that does not answer. pyggml asks first: :func:`handshake` connects with a time limit,
checks the protocol version and the device count, and raises RPCError where ggml-rpc would
abort; after that every call that waits for the server has the Backend's time limit
(pyggml._core's Remote, csrc/remote.c)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

from pyggml.errors import ArgumentError, RPCError

__all__ = ["RPCServer", "connected", "handshake", "remotes", "rpc_server", "serve"]

# ggml-rpc's wire format (ggml/src/ggml-rpc/ggml-rpc.cpp): a command byte, a little-endian
# uint64 size, the request; an answer is a uint64 size and the response.
_CMD_HELLO = 14             # "RPC_CMD_HELLO must be always 14" (a static_assert of ggml-rpc)
_CMD_DEVICE_COUNT = 15
# HELLO carries RPC_CONN_CAPS_SIZE (24) bytes of transport capabilities (all zero: plain TCP);
# its answer is major, minor, patch, one padding byte, and the server's 24. So in the
# protocols pyggml was checked against: 5.0.0 (ggml 0.20.2) and 7.0.0 (ggml 0.25.3).
_CAPS = 24
_PROTOCOL_MAJORS = (5, 7)


def _split(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ArgumentError(f"endpoint must be 'host:port' with a port in [1, 65535], got {endpoint!r}")
    return host, int(port)


def _recv(sock: socket.socket, n: int, endpoint: str, what: str) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise RPCError(f"the server at {endpoint} closed the connection during the handshake ({what}): it is "
                           f"not an RPC server of this ggml's protocol (such a server closes a connection whose "
                           f"HELLO it cannot read), or it stopped", endpoint)
        out += chunk
    return out


def handshake(endpoint: str, timeout: float = 10.0) -> dict[str, Any]:
    """handshake(endpoint, timeout=10.0) -> dict

    What ggml-rpc does first when it connects (HELLO, then the device count), made by pyggml
    with a time limit: ``{"version": (major, minor, patch), "devices": n}``. Raises RPCError
    where ggml-rpc would abort the process or wait for ever: nothing listening, no answer
    within ``timeout`` seconds (a server serves one client at a time: another may be
    connected), a server of another protocol version, or something else on that port."""
    from pyggml._backend import rpc_protocol

    host, port = _split(endpoint)
    mine = rpc_protocol()
    if mine is None:
        raise RPCError("this pyggml was built without ggml's RPC backend (PYGGML_RPC=OFF)", endpoint)
    if mine[0] not in _PROTOCOL_MAJORS:
        raise RPCError(f"this ggml speaks RPC protocol {mine[0]}.{mine[1]}.{mine[2]}; pyggml's handshake knows "
                       f"protocols {' and '.join(f'{m}.x' for m in _PROTOCOL_MAJORS)} only", endpoint)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.timeout:
        raise RPCError(f"cannot reach an RPC server at {endpoint}: no connection within {timeout:g} s", endpoint) \
            from None
    except OSError as e:
        raise RPCError(f"cannot reach an RPC server at {endpoint}: {e.strerror or e}", endpoint) from None
    try:
        sock.settimeout(timeout)
        sock.sendall(bytes([_CMD_HELLO]) + struct.pack("<Q", _CAPS) + bytes(_CAPS))
        size = struct.unpack("<Q", _recv(sock, 8, endpoint, "HELLO"))[0]
        if size != 4 + _CAPS:
            raise RPCError(f"the server at {endpoint} answered HELLO with {size} bytes, where protocol "
                           f"{mine[0]}.x answers {4 + _CAPS}: it speaks another protocol", endpoint)
        rsp = _recv(sock, size, endpoint, "HELLO")
        version = (rsp[0], rsp[1], rsp[2])
        if version[0] != mine[0] or version[1] > mine[1]:
            raise RPCError(f"the server at {endpoint} speaks RPC protocol {version[0]}.{version[1]}.{version[2]}, "
                           f"this ggml {mine[0]}.{mine[1]}.{mine[2]} (the major versions must be equal, and the "
                           f"server's minor at most this one's): ggml-rpc would abort the process", endpoint)
        sock.sendall(bytes([_CMD_DEVICE_COUNT]) + struct.pack("<Q", 0))
        size = struct.unpack("<Q", _recv(sock, 8, endpoint, "the device count"))[0]
        if size != 4:
            raise RPCError(f"the server at {endpoint} answered the device count with {size} bytes, not 4", endpoint)
        devices = struct.unpack("<I", _recv(sock, 4, endpoint, "the device count"))[0]
    except socket.timeout:
        raise RPCError(f"the server at {endpoint} did not answer the handshake within {timeout:g} s (an RPC server "
                       f"serves one client at a time: is another connected?)", endpoint) from None
    except ConnectionResetError:
        raise RPCError(f"the server at {endpoint} closed the connection during the handshake (reset): it is not an "
                       f"RPC server of this ggml's protocol, or it stopped", endpoint) from None
    except OSError as e:
        raise RPCError(f"the handshake with {endpoint} failed: {e.strerror or e}", endpoint) from None
    finally:
        sock.close()
    if devices == 0:
        raise RPCError(f"the server at {endpoint} has no device (ggml-rpc would make no backend)", endpoint)
    return {"version": version, "devices": devices}


def connected(endpoint: str) -> bool:
    """connected(endpoint) -> bool: whether this process holds an open TCP connection to
    ``endpoint`` (Linux: /proc). ggml-rpc keeps one connection per endpoint while any of
    its backends or buffers lives, and a server serves one client at a time: a second
    handshake would wait for the first connection to close. False where /proc cannot tell."""
    host, port = _split(endpoint)
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
    except OSError:
        return False
    inodes = set()
    for table, v6 in (("/proc/self/net/tcp", False), ("/proc/self/net/tcp6", True)):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "01":         # ESTABLISHED
                continue
            rhex, _, rport = fields[2].partition(":")
            if int(rport, 16) != port:
                continue
            raw = bytes.fromhex(rhex)
            # /proc prints the address as host-order 32-bit words
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            try:
                ip = socket.inet_ntop(socket.AF_INET6 if v6 else socket.AF_INET, raw)
            except ValueError:
                continue
            if ip.startswith("::ffff:"):
                ip = ip[7:]
            if ip in addrs:
                inodes.add(fields[9])
    if not inodes:
        return False
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def remotes() -> dict[str, str | None]:
    """remotes() -> dict: each RPC server this process has talked to ("host:port") -> None,
    or why its connection was given up (after which the endpoint raises RPCError)."""
    from pyggml._core import rpc_remotes

    return dict(rpc_remotes())


def serve(host: str = "127.0.0.1", port: int = 50052, devices: tuple[str, ...] = ("CPU",), n_threads: int = 1,
          cache_dir: str | None = None) -> None:
    """serve(host="127.0.0.1", port=50052, devices=("CPU",), n_threads=1, cache_dir=None)

    Serve ``devices`` (names of :func:`pyggml.backends`) at host:port in this process, for
    ever (``ggml_backend_rpc_start_server``); RPCError when it cannot start. The server
    has no authentication: bind it to a trusted network only."""
    from pyggml._backend import _rpc_serve

    if not isinstance(port, int) or not 0 < port < 65536:
        raise ArgumentError(f"serve: port must be in [1, 65535], got {port!r}")
    if not isinstance(n_threads, int) or not 0 < n_threads <= 512:
        raise ArgumentError(f"serve: n_threads must be in [1, 512], got {n_threads!r}")
    _rpc_serve(f"{host}:{port}", list(devices), n_threads, cache_dir)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class RPCServer:
    """RPCServer(device="CPU", host="127.0.0.1", port=0, n_threads=1, start_timeout=30.0)

    A ggml RPC server over ``device`` in a process of its own (``python -m pyggml.rpc``),
    started and answering the handshake when the constructor returns; ``port=0`` picks a
    free one. ``endpoint``: "host:port" for ``pyggml.Backend("RPC", endpoint=...)``.
    ``stop()`` (or leaving a ``with`` block) ends it; ``kill()`` ends it at once
    (SIGKILL), as a crash would. What the server printed: ``log()``."""

    def __init__(self, device: str = "CPU", host: str = "127.0.0.1", port: int = 0, n_threads: int = 1,
                 start_timeout: float = 30.0) -> None:
        if not isinstance(port, int) or not 0 <= port < 65536:
            raise ArgumentError(f"RPCServer: port must be in [0, 65535], got {port!r}")
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="pyggml-rpc-", suffix=".log", delete=False)
        last = None
        for _ in range(3 if port == 0 else 1):     # a port picked free may be taken before the server binds it
            p = port or _free_port(host)
            self.endpoint = f"{host}:{p}"
            # cwd: a folder of no package's, since ``python -m`` puts the working folder first on
            # sys.path, and a source checkout's pyggml/ there (no compiled modules) would shadow
            # the installed one
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pyggml.rpc", "--host", host, "--port", str(p), "--device", device,
                 "--threads", str(n_threads)],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=tempfile.gettempdir())
            try:
                self._wait_ready(start_timeout)
                return
            except RPCError as e:
                last = e
                self._end(signal.SIGKILL)
        assert last is not None
        raise last

    def _wait_ready(self, limit: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + limit
        while True:
            if self.process.poll() is not None:
                raise RPCError(f"RPCServer: the server at {self.endpoint} exited ({self.process.returncode}) before "
                               f"it served: {self.log()[-2000:]}", self.endpoint)
            try:
                handshake(self.endpoint, timeout=2.0)
                # this server's answer, not another's on the same address (it says it accepted)
                if "Accepted client connection" in self.log():
                    return
                raise RPCError("another process answered", self.endpoint)
            except RPCError:
                if time.monotonic() > deadline:
                    raise RPCError(f"RPCServer: no answer from {self.endpoint} within {limit:g} s: "
                                   f"{self.log()[-2000:]}", self.endpoint) from None
                time.sleep(0.05)

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        """What the server process printed so far."""
        try:
            with open(self._log.name, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _end(self, sig: int) -> None:
        p = self.process
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL after 10 s); idempotent."""
        self._end(signal.SIGTERM)
        try:
            os.unlink(self._log.name)
        except OSError:
            pass

    def kill(self) -> None:
        """End the server at once (SIGKILL), as a crash or a lost machine would."""
        self._end(signal.SIGKILL)

    def __enter__(self) -> "RPCServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"<pyggml.rpc.RPCServer {self.endpoint}{'' if self.running() else ' stopped'}>"


def rpc_server(device: str = "CPU", host: str = "127.0.0.1", port: int = 0, n_threads: int = 1) -> RPCServer:
    """rpc_server(device="CPU", host="127.0.0.1", port=0, n_threads=1) -> RPCServer: a
    started server (see RPCServer)."""
    return RPCServer(device, host, port, n_threads)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyggml.rpc",
                                 description="Serve a device of this pyggml's ggml over ggml's RPC protocol "
                                             "(no authentication: bind to a trusted network only).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=50052)
    ap.add_argument("--device", action="append", help="a device of pyggml.backends() (default: CPU); repeatable")
    ap.add_argument("--threads", type=int, default=1, help="the CPU backend's threads")
    ap.add_argument("--cache-dir", default=None, help="ggml-rpc's tensor cache (default: none)")
    args = ap.parse_args(argv)
    try:
        serve(args.host, args.port, tuple(args.device or ["CPU"]), args.threads, args.cache_dir)
    except Exception as e:          # noqa: BLE001 - the server's one line of failure
        print(f"pyggml.rpc: {e}", file=sys.stderr)
        return 1
    return 1


if __name__ == "__main__":
    sys.exit(main())
