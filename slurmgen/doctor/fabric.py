"""The network facts of one node for `slurmgen doctor --fabric`, and the bandwidth probe all nodes run together.

Facts (`facts`): the node's hostname and the addresses it resolves to (a loopback address, as
Debian's default /etc/hosts gives the machine's own name, 127.0.1.1, is a known cause of
failed multi-node rendezvous: torch advertises it and the other nodes cannot reach it), every
interface with an IPv4 address and whether the master's address is on its network, the
interface and source address the kernel routes to the master by, the NCCL_*/GLOO_* settings
seen, and the InfiniBand/EFA devices under /sys/class/infiniband with the transport NCCL would
pick. Nothing is sent anywhere for these: the route is asked of a UDP socket that never sends.

Bandwidth (`bandwidth`, every probe of the run at once): the node that owns MASTER_ADDR hosts a
torch TCPStore on the port beside MASTER_PORT (contract/ports.py link_port); each probe takes a
rank from it, sends a block to the next rank over plain TCP (a ring, all links at once: the raw
throughput each link gives), then all run a gloo all-reduce of the same nodes, timed, as bus
bandwidth (2(n-1)/n x bytes / time, the measure nccl-tests use, comparable to one link's
throughput). `compare.py` judges the numbers.
torch is imported only inside `bandwidth`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import threading
import time
from datetime import timedelta
from ipaddress import IPv4Interface, ip_address
from pathlib import Path
from typing import Any

from slurmgen.contract import ports

SYS_RDMA = Path("/sys/class/infiniband")
ALLREDUCE_ITERS = 3
TCP_FACTOR = 4  # the TCP block is this many all-reduce buffers: long enough to time on a fast link
_SIOCGIFADDR, _SIOCGIFNETMASK = 0x8915, 0x891B


def _ifreq(sock: socket.socket, request: int, name: str) -> str | None:
    try:
        data = fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()[:15]))
    except OSError:
        return None
    return socket.inet_ntoa(data[20:24])


def interfaces() -> list[dict[str, Any]]:
    """Every interface with an IPv4 address: name, address, prefix length (from the kernel's ioctls)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            addr = _ifreq(sock, _SIOCGIFADDR, name)
            mask = _ifreq(sock, _SIOCGIFNETMASK, name)
            if addr and mask:
                found.append({"name": name, "addr": addr, "prefix": IPv4Interface(f"{addr}/{mask}").network.prefixlen})
    return found


def route_to(ip: str) -> str | None:
    """The source address the kernel picks to reach `ip` (connecting a UDP socket sends nothing)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((ip, 9))
            return sock.getsockname()[0]
    except OSError:
        return None


def hostname_addresses(name: str) -> list[str]:
    try:
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)})
    except OSError:
        return []


def rdma() -> dict[str, Any]:
    """InfiniBand/EFA devices and whether any port is ACTIVE; EFA devices are named efa* or use the efa driver."""
    devices = []
    for dev in sorted(SYS_RDMA.glob("*")) if SYS_RDMA.is_dir() else []:
        states = [p.read_text().split(":")[-1].strip() for p in dev.glob("ports/*/state") if p.is_file()]
        driver = (
            os.path.basename(os.path.realpath(dev / "device" / "driver"))
            if (dev / "device" / "driver").exists()
            else ""
        )
        devices.append(
            {"name": dev.name, "efa": dev.name.startswith("efa") or driver == "efa", "active": "ACTIVE" in states}
        )
    return {"devices": devices}


def facts(master_ip: str | None) -> dict[str, Any]:
    """What this node's network looks like to a rendezvous with `master_ip`."""
    name = socket.gethostname()
    ifaces = interfaces()
    source = route_to(master_ip) if master_ip else None
    for iface in ifaces:
        net = IPv4Interface(f"{iface['addr']}/{iface['prefix']}").network
        iface["reaches_master"] = bool(master_ip and ":" not in master_ip and ip_address(master_ip) in net)
    by_addr = {i["addr"]: i["name"] for i in ifaces}
    return {
        "master": master_ip,
        "hostname": name,
        "resolves": hostname_addresses(name),
        "resolves_ifaces": {a: by_addr.get(a) for a in hostname_addresses(name)},
        "route": {"addr": source, "iface": by_addr.get(source or "")},
        "interfaces": ifaces,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "GLOO_"))},
        "rdma": rdma(),
    }


def _can_bind(ip: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EADDRINUSE):
                return False
            raise
    return True


def _tcp_ring(store: Any, rank: int, nodes: int, addr: str, nbytes: int, timeout: float) -> dict[str, Any]:
    """Send `nbytes` to the next rank while receiving as many from the previous one; the
    receiving side times its link from the first byte to the last."""
    server = socket.create_server((addr, 0))
    server.settimeout(timeout)
    store.set(f"tcp/{rank}", f"{addr} {server.getsockname()[1]}")
    result: dict[str, Any] = {}

    def receive() -> None:
        try:
            conn, _ = server.accept()
        except OSError as exc:  # the previous rank never connected: the sender's side says why
            result["error"] = str(exc)
            return
        with conn:
            conn.settimeout(timeout)
            got, start, block = 0, 0.0, bytearray(1 << 20)
            while got < nbytes:
                n = conn.recv_into(block)
                if not n:
                    break
                start = start or time.perf_counter()
                got += n
            result["seconds"] = time.perf_counter() - start
            result["bytes"] = got
            conn.sendall(b"k")

    reader = threading.Thread(target=receive, daemon=True)
    reader.start()
    host, port = store.get(f"tcp/{(rank + 1) % nodes}").decode().split()
    with socket.create_connection((host, int(port)), timeout=timeout) as out:
        payload = b"\0" * (1 << 20)
        for _ in range(nbytes // len(payload)):
            out.sendall(payload)
        out.recv(1)
    reader.join(timeout)
    server.close()
    if result.get("error") or "seconds" not in result:
        raise TimeoutError(
            f"no TCP block from the previous rank within {timeout:g} s: {result.get('error', 'timed out')}"
        )
    secs = result.get("seconds") or 0.0
    return {"bytes": result.get("bytes", 0), "gbps": round(result.get("bytes", 0) / secs / 1e9, 3) if secs else None}


def bandwidth(master_ip: str, port: int, nodes: int, mb: float, timeout: float, node: str) -> dict[str, Any]:
    """Raw TCP on each ring link, then a gloo all-reduce across the same nodes (see the module doc)."""
    import torch
    import torch.distributed as dist

    store = dist.TCPStore(
        master_ip, port, nodes, _can_bind(master_ip, port), timedelta(seconds=timeout), wait_for_workers=False
    )
    rank = store.add("slurmgen-fabric-rank", 1) - 1
    store.set(f"name/{rank}", node)
    nbytes = max(1, int(mb * (1 << 20)) >> 20) << 20
    addr = route_to(master_ip) or master_ip
    link = _tcp_ring(store, rank, nodes, addr, nbytes * TCP_FACTOR, timeout)
    link["from"] = store.get(f"name/{(rank - 1) % nodes}").decode()
    link["to"] = node
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore("allreduce", store),
        rank=rank,
        world_size=nodes,
        timeout=timedelta(seconds=timeout),
    )
    try:
        data = torch.ones(nbytes // 4, dtype=torch.float32)
        dist.all_reduce(data)  # warm-up: gloo connects its pairs on first use
        dist.barrier()
        start = time.perf_counter()
        for _ in range(ALLREDUCE_ITERS):
            dist.all_reduce(data)
        seconds = time.perf_counter() - start
        right = bool(torch.all(data == float(nodes) ** (ALLREDUCE_ITERS + 1)))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    bus = 2 * (nodes - 1) / nodes * nbytes * ALLREDUCE_ITERS / seconds
    return {
        "rank": rank,
        "nodes": nodes,
        "mb": nbytes >> 20,
        "tcp": link,
        "allreduce": {"seconds": round(seconds, 4), "bus_gbps": round(bus / 1e9, 3), "correct": right},
    }


def check(master_ip: str | None, port: int | None, nodes: int, mb: float, timeout: float, node: str) -> dict[str, Any]:
    """This node's facts and, with two nodes or more, its part of the bandwidth probe (never raises)."""
    row = facts(master_ip)
    if nodes < 2 or not master_ip or not port:
        row["bandwidth"] = {"skipped": "needs two nodes or more and a master address and port"}
        return row
    try:
        row["bandwidth"] = bandwidth(master_ip, ports.link_port(port), nodes, mb, timeout, node)
    except Exception as exc:  # torch missing, a peer that never came, a link that broke: all say why
        row["bandwidth"] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}
    return row
