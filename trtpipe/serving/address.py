"""The gRPC address smoke and bench are given, and what to say when it is another kind of address.

Triton listens on three ports (`serve` names them: gRPC, HTTP, metrics; upstream's defaults 8001, 8000,
8002). The gRPC client takes `host:port` only: `http://host:8001` fails in name resolution ("Misformatted
domain name"), and Triton's HTTP or metrics port closes a gRPC connection ("Socket closed"), both reported
as a raw UNAVAILABLE. So, before a check or a load runs:

- a scheme (`http://`, `https://`, `grpc://` ...) is refused in one line naming the `host:port` form;
- an address whose gRPC health call fails is asked over HTTP: an answer from Triton's `/v2/health/live` is its
  HTTP port, from `/metrics` its metrics port; either is refused in one line, naming the server's gRPC port
  when this host can see it (the other ports the same process listens on, the one that answers gRPC).

An address nothing answers on is left to the caller, which reports an unreachable server as it always has.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request

from trtpipe.errors import WrongAddress

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
GRPC_DEFAULT_PORT = 8001
ASK_TIMEOUT_S = 3.0


def check_grpc_address(url: str, *, timeout: float = ASK_TIMEOUT_S) -> str:
    """`url` checked as the module docstring says: the address to use, or WrongAddress naming the one to give."""
    match = _SCHEME.match(url.strip())
    if match is not None:
        scheme, address = match.group(1), match.group(2).split("/", 1)[0]
        if address and _answers_grpc(address, timeout):
            fix = f"give {address}, without the scheme"
            found: str | None = address
        else:
            found = _grpc_port_of_same_server(address, timeout) if address and _http_kind(address, timeout) else None
            fix = (f"give {found}, the gRPC port of the same server, without a scheme" if found
                   else f"give the server's gRPC port as host:port (Triton's default is {GRPC_DEFAULT_PORT})")
        raise WrongAddress(f"{url} has the scheme {scheme}://; smoke and bench speak gRPC to host:port, with no scheme",
                           address=url, grpc_address=found, fix=fix)
    if _answers_grpc(url, timeout):
        return url
    kind = _http_kind(url, timeout)
    if kind is None:
        return url  # nothing answers there: the caller reports an unreachable server
    found = _grpc_port_of_same_server(url, timeout)
    fix = (f"give {found}, the gRPC port of the same server" if found else
           f"give the server's gRPC port (Triton's default is {GRPC_DEFAULT_PORT})")
    raise WrongAddress(f"{url} is Triton's {kind} port, which answers HTTP; smoke and bench speak gRPC",
                       address=url, grpc_address=found, fix=fix)


def _split(address: str) -> tuple[str, int] | None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _answers_grpc(address: str, timeout: float) -> bool:
    import tritonclient.grpc as grpcclient

    try:
        client = grpcclient.InferenceServerClient(address)
    except Exception:  # noqa: BLE001 - an address the client cannot even parse: not a gRPC server
        return False
    try:
        client.is_server_live(client_timeout=timeout)
        return True
    except Exception:  # noqa: BLE001 - any failure: it did not answer gRPC
        return False
    finally:
        try:
            client.close()
        except Exception:  # noqa: BLE001
            pass


def _http_kind(address: str, timeout: float) -> str | None:
    """"HTTP" when Triton's HTTP health endpoint answers at `address`, "metrics" when its metrics endpoint
    does, else None."""
    split = _split(address)
    if split is None:
        return None
    host, port = split
    base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    # The metrics port answers any path (its /v2/health/live too, 200 on tritonserver 2.51.0); the HTTP port
    # answers /metrics with 404: so /metrics first, told by its Prometheus text.
    for path, kind in (("/metrics", "metrics"), ("/v2/health/live", "HTTP")):
        try:
            with urllib.request.urlopen(base + path, timeout=timeout) as response:  # noqa: S310 - the user's address
                body = response.read(4096).decode("utf-8", "replace")
        except urllib.error.HTTPError as err:
            if kind == "HTTP" and err.code in (400, 503):  # Triton's HTTP port, not live yet
                return kind
            continue
        except (OSError, ValueError):
            return None  # not HTTP at all (refused, reset, timed out)
        if kind == "HTTP" or "nv_" in body:
            return kind
    return None


def _grpc_port_of_same_server(address: str, timeout: float) -> str | None:
    """`host:port` of the gRPC port of the process listening at `address`, when this host lets us see it."""
    split = _split(address)
    if split is None:
        return None
    host, port = split
    try:
        import psutil

        owners = [c.pid for c in psutil.net_connections(kind="tcp")
                  if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid]
        if not owners:
            return None
        others = sorted({c.laddr.port for c in psutil.Process(owners[0]).net_connections(kind="tcp")
                         if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port != port})
    except Exception:  # noqa: BLE001 - not ours to read: the fix then names the default port
        return None
    for other in others:
        candidate = f"{host}:{other}"
        if _answers_grpc(candidate, timeout):
            return candidate
    return None
