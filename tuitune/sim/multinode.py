"""Multi-node SGLang in the simulator: ``--nnodes``, ``--node-rank``, ``--dist-init-addr``.

What real SGLang does (docs.sglang.io, Multi-Node Deployment; sglang/srt/entrypoints/engine.py):
every node runs the same command with its own ``--node-rank``; torch.distributed's store on node 0
at ``--dist-init-addr`` holds start-up until every rank joined; node 0 serves the HTTP API; a node
of rank > 0 runs only its schedulers and, once they are up, a dummy ``/health`` on its own
``--host:--port``; a node whose peer went away fails on its next collective and exits.

Here: node 0 listens on the dist-init port; every other node connects and sends one line
``join RANK NNODES``; node 0 answers ``ok`` to all once every rank joined (or an error line to a
rank that does not fit). The connections stay open while serving, so a closed connection is a
peer that went away: node 0 then fails like NCCL's watchdog, the others like their schedulers.

The inter-node all-reduce cost (``internode_ms``) is the tensor-parallel all-reduces of one target
forward crossing the network; the inter-node NCCL variables pick its transport and scale it.
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass

from aiohttp import web

from tuitune.sim import model
from tuitune.sim.args import ServerArgsError

# Kimi-K2.5 / DeepSeek-V3: 61 layers, two tensor-parallel all-reduces each per forward.
ALLREDUCES_PER_FORWARD = 122
HIDDEN_BYTES = 7168 * 2  # one token's hidden state in bf16
# The simulated cluster: four HCAs a node, NIC and GPUs behind one PCIe switch (PXB apart).
SIM_HCAS = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
NIC_GPU_DISTANCE = "PXB"
GDR_ORDER = ("LOC", "PIX", "PXB", "PHB", "SYS")
IB_LATENCY_US, IB_GBPS = 10.0, 40.0  # per all-reduce step; NDR 400 Gb/s
SOCKET_LATENCY_US, SOCKET_GBPS_PER_STREAM = 35.0, 1.5
GDR_OFF_LATENCY_US, GDR_OFF_BW = 3.0, 0.8  # staged through host memory


@dataclass(frozen=True, slots=True)
class Dist:
    nnodes: int
    rank: int
    host: str
    port: int

    @property
    def multi(self) -> bool:
        return self.nnodes > 1


def parse(ns) -> Dist:
    """Check the multi-node flags as SGLang does; raises ServerArgsError. A namespace without them
    (the vLLM dialect's) is one node."""
    if not hasattr(ns, "nnodes"):
        return Dist(1, 0, "", 0)
    if ns.nnodes < 1:
        raise ServerArgsError(f"nnodes must be >= 1 (got {ns.nnodes})")
    if not 0 <= ns.node_rank < ns.nnodes:
        raise ServerArgsError(f"node_rank ({ns.node_rank}) must be in [0, nnodes) = [0, {ns.nnodes})")
    if ns.nnodes == 1:
        return Dist(1, 0, "", 0)
    if not ns.dist_init_addr:
        raise ServerArgsError("--dist-init-addr HOST:PORT is required when --nnodes > 1")
    if ns.tp_size % ns.nnodes:
        raise ServerArgsError(f"tp_size ({ns.tp_size}) must be divisible by nnodes ({ns.nnodes})")
    host, sep, port = ns.dist_init_addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ServerArgsError(f"--dist-init-addr {ns.dist_init_addr!r} is not HOST:PORT")
    return Dist(ns.nnodes, ns.node_rank, host.strip("[]"), int(port))


# ---- the network NCCL would use --------------------------------------------------------------


def _filter(names: list[str], spec: str) -> list[str]:
    """NCCL's interface/HCA filter: prefixes, ``=`` exact, leading ``^`` excludes (NCCL env docs)."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    pats = [p.strip().split(":")[0] for p in spec.split(",") if p.strip()]

    def hit(n: str) -> bool:
        return any(n == p if exact else n.startswith(p) for p in pats)

    return [n for n in names if hit(n) != exclude]


def interfaces() -> list[str]:
    try:
        return [n for _, n in socket.if_nameindex()]
    except OSError:
        return ["lo"]


def socket_interface(env: dict[str, str]) -> str | None:
    """The interface NCCL's bootstrap would pick, or None (NCCL: no socket interface found)."""
    names = interfaces()
    spec = env.get("NCCL_SOCKET_IFNAME")
    if spec:
        chosen = _filter(names, spec)
    else:  # NCCL's default skips loopback and docker unless nothing else is there
        chosen = [n for n in names if not n.startswith(("lo", "docker"))] or names
    return chosen[0] if chosen else None


def transport(env: dict[str, str]) -> tuple[str, list[str]]:
    """("IB", hcas) or ("Socket", []): IB unless disabled or NCCL_IB_HCA matches no device."""
    if env.get("NCCL_IB_DISABLE", "0").strip() == "1":
        return "Socket", []
    hcas = _filter(list(SIM_HCAS), env["NCCL_IB_HCA"]) if env.get("NCCL_IB_HCA") else list(SIM_HCAS)
    return ("IB", hcas) if hcas else ("Socket", [])


def _int(env: dict[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except ValueError:
        return default


def gdr_enabled(env: dict[str, str]) -> bool:
    level = env.get("NCCL_NET_GDR_LEVEL", NIC_GPU_DISTANCE).strip()
    if level.isdigit():  # legacy integers 0..4 = LOC..SYS
        level = GDR_ORDER[min(int(level), len(GDR_ORDER) - 1)]
    if level not in GDR_ORDER:
        return True
    return GDR_ORDER.index(level) >= GDR_ORDER.index(NIC_GPU_DISTANCE)


def internode_ms(env: dict[str, str], nnodes: int, tokens: int) -> float:
    """Inter-node all-reduce time of one target forward of ``tokens`` tokens (0 on one node).

    Latency-bound at decode sizes: per all-reduce a network step (scaled by the protocol: LL cuts
    it) plus the bytes a ring moves across the link, 2(n-1)/n of the message.
    """
    if nnodes <= 1:
        return 0.0
    kind, _ = transport(env)
    if kind == "IB":
        lat, gbps = IB_LATENCY_US, IB_GBPS * min(1.25, 1 + 0.1 * (_int(env, "NCCL_IB_QPS_PER_CONNECTION", 1) - 1))
        if not gdr_enabled(env):
            lat, gbps = lat + GDR_OFF_LATENCY_US, gbps * GDR_OFF_BW
    else:
        streams = max(1, _int(env, "NCCL_SOCKET_NTHREADS", 1)) * max(1, _int(env, "NCCL_NSOCKS_PERTHREAD", 1))
        lat, gbps = SOCKET_LATENCY_US, SOCKET_GBPS_PER_STREAM * min(streams, 8)
    if "NCCL_PROTO" in env:
        lat *= model._proto_factor(env["NCCL_PROTO"])
    steps = 2 * (nnodes - 1)
    wire = 2 * (nnodes - 1) / nnodes * HIDDEN_BYTES * max(1, tokens)
    per_allreduce_us = steps * lat + wire / (gbps * 1e3)  # GB/s = 1e3 bytes/us
    return ALLREDUCES_PER_FORWARD * per_allreduce_us / 1000.0


def nccl_net_lines(env: dict[str, str], head: str) -> tuple[list[str], str | None]:
    """NCCL INFO lines about the network (with NCCL_DEBUG=INFO) and a fatal WARN, if any."""
    ifname = socket_interface(env)
    if ifname is None:
        return [], (
            f"{head} WARN Bootstrap : no socket interface found (NCCL_SOCKET_IFNAME="
            f"{env.get('NCCL_SOCKET_IFNAME', '')}; this node has {', '.join(interfaces())})"
        )
    lines = [f"{head} INFO Bootstrap : Using {ifname}:127.0.0.1<0>"]
    kind, hcas = transport(env)
    if kind == "IB":
        devs = " ".join(f"[{i}]{h}:1/IB" for i, h in enumerate(hcas))
        lines.append(f"{head} INFO NET/IB : Using {devs} ; OOB {ifname}:127.0.0.1<0>")
        lines.append(f"{head} INFO Using network IB")
        gdr = "enabled" if gdr_enabled(env) else "disabled"
        lines.append(f"{head} INFO GPU Direct RDMA {gdr} for HCA 0 (distance {NIC_GPU_DISTANCE})")
    else:
        if env.get("NCCL_IB_HCA") and env.get("NCCL_IB_DISABLE", "0").strip() != "1":
            lines.append(f"{head} INFO NET/IB : No device found.")
        lines.append(f"{head} INFO NET/Socket : Using [0]{ifname}:127.0.0.1<0>")
        lines.append(f"{head} INFO Using network Socket")
    return lines, None


# ---- rendezvous ------------------------------------------------------------------------------


class Rendezvous:
    """Node 0's side: accept ``nnodes - 1`` joins, then watch the connections."""

    def __init__(self, dist: Dist):
        self.dist = dist
        self.peers: dict[int, asyncio.StreamWriter] = {}
        self.all_joined = asyncio.Event()
        self.lost: asyncio.Future = asyncio.get_running_loop().create_future()
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        # torch's store binds every interface on node 0
        self.server = await asyncio.start_server(self._peer, host=None, port=self.dist.port, reuse_address=True)

    async def _peer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            words = (await asyncio.wait_for(reader.readline(), 10)).decode("ascii", "replace").split()
        except (TimeoutError, ConnectionError):
            writer.close()
            return
        err = None
        if len(words) != 3 or words[0] != "join" or not words[1].isdigit() or not words[2].isdigit():
            err = "not a tuitune.sim node"
        elif int(words[2]) != self.dist.nnodes:
            err = f"nnodes mismatch: node 0 has {self.dist.nnodes}, this node {words[2]}"
        elif not 0 < int(words[1]) < self.dist.nnodes or int(words[1]) in self.peers:
            err = f"node_rank {words[1]} is out of range or already joined"
        if err:
            writer.write(f"error {err}\n".encode())
            writer.close()
            return
        rank = int(words[1])
        self.peers[rank] = writer
        if len(self.peers) == self.dist.nnodes - 1:
            for w in self.peers.values():
                w.write(b"ok\n")
            self.all_joined.set()
        try:
            await reader.read()  # EOF: the peer went away
        except asyncio.CancelledError:
            return  # node 0 itself is shutting down
        except ConnectionError:
            pass
        if not self.lost.done():
            self.lost.set_result(rank)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for w in self.peers.values():
            w.close()


async def join(dist: Dist, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | str:
    """A node of rank > 0 joins node 0; returns the open connection or an error sentence."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            reader, writer = await asyncio.open_connection(dist.host, dist.port)
            break
        except OSError:
            if loop.time() > deadline:
                return f"timed out after {timeout:g} s connecting to {dist.host}:{dist.port}"
            await asyncio.sleep(0.1)
    writer.write(f"join {dist.rank} {dist.nnodes}\n".encode())
    try:
        answer = await asyncio.wait_for(reader.readline(), max(0.1, deadline - loop.time()))
    except TimeoutError:
        return f"timed out after {timeout:g} s waiting for the other nodes to join"
    text = answer.decode("ascii", "replace").strip()
    if text != "ok":
        return text.removeprefix("error ") or f"{dist.host}:{dist.port} closed the connection"
    return reader, writer


async def dummy_health(host: str, port: int) -> web.AppRunner:
    """What SGLang serves on a node of rank > 0: /health and /health_generate, always 200."""

    async def ok(request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    app.router.add_get("/health", ok)
    app.router.add_get("/health_generate", ok)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    return runner


class Node:
    """This process's part in a multi-node server; every method is a no-op on one node."""

    def __init__(self, sim):
        self.sim = sim
        self.dist = parse(sim.ns)
        self.rendezvous: Rendezvous | None = None
        self.link: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    @property
    def worker(self) -> bool:
        return self.dist.rank > 0

    def fail(self, error: str) -> bool:
        self.sim.traceback(error)
        return False

    async def join(self) -> bool:
        """Start-up step: node 0 waits for every node, the others join it (SGLang's dist init)."""
        if not self.dist.multi:
            return True
        log, d = self.sim.log, self.dist
        timeout = self.sim.ns.dist_timeout
        log.line(f"Init torch distributed begin. nnodes={d.nnodes} node_rank={d.rank} dist_init_addr={d.host}:{d.port}")
        if self.worker:
            got = await join(d, timeout)
            if isinstance(got, str):
                return self.fail(f"torch.distributed.DistNetworkError: node {d.rank}: {got}")
            self.link = got
        else:
            self.rendezvous = Rendezvous(d)
            try:
                await self.rendezvous.start()
            except OSError as e:
                return self.fail(
                    "torch.distributed.DistNetworkError: The server socket has failed to listen on "
                    f"any local network address. port: {d.port}, code: {-(e.errno or 0)}, "
                    f"message: {(e.strerror or str(e)).lower()}"
                )
            try:
                await asyncio.wait_for(self.rendezvous.all_joined.wait(), timeout)
            except TimeoutError:
                return self.fail(
                    f"torch.distributed.DistStoreError: Timed out after {timeout:g} seconds waiting "
                    f"for clients. {len(self.rendezvous.peers) + 1}/{d.nnodes} clients joined."
                )
        log.line("Init torch distributed ends. mem usage=0.00 GB")
        return True

    async def watch(self) -> None:
        """Node 0 while serving: a node that goes away fails the server (NCCL's watchdog)."""
        if self.rendezvous is None:
            return
        rank = await self.rendezvous.lost
        self.sim.traceback(
            f"torch.distributed.DistBackendError: [Rank 0] NCCL watchdog: communicator aborted: "
            f"node {rank} (ranks {rank * self.per_node}..{(rank + 1) * self.per_node - 1}) closed "
            "the connection\nncclRemoteError: A call failed possibly due to a network error or a "
            "remote process exiting prematurely."
        )
        self.sim.kill_children()
        os._exit(1)

    @property
    def per_node(self) -> int:
        return self.sim.ns.tp_size // self.dist.nnodes

    async def serve_worker(self) -> int:
        """A node of rank > 0 after start-up: dummy /health until node 0 goes or SIGTERM comes."""
        ns, log = self.sim.ns, self.sim.log
        try:
            runner = await dummy_health(ns.host, ns.port)
        except OSError as e:
            log.line(
                f"ERROR:    [Errno {e.errno}] error while attempting to bind on address "
                f"({ns.host!r}, {ns.port}): {(e.strerror or str(e)).lower()}",
                rank=None,
                force=True,
            )
            return 1
        log.line(
            f"Dummy health check server started on http://{ns.host}:{ns.port} "
            f"(node {self.dist.rank} of {self.dist.nnodes})",
            rank=None,
        )
        reader, writer = self.link
        lost = asyncio.ensure_future(reader.read())
        stop = asyncio.ensure_future(self.sim.stopping.wait())
        try:
            await asyncio.wait({lost, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            stop.cancel()
            writer.close()
            await runner.cleanup()
        if self.sim.stopping.is_set():
            return 0
        first = self.dist.rank * self.per_node
        self.sim.log.line(
            f"[rank{first}]: NCCL communicator was aborted: node 0 "
            f"({self.dist.host}:{self.dist.port}) closed the connection "
            "(ncclRemoteError: remote process exited or there was a network error)",
            force=True,
        )
        self.sim.log.line(f"Scheduler or DataParallelController {os.getpid()} terminated with 1", rank=None, force=True)
        return 1

    def close(self) -> None:
        if self.rendezvous is not None:
            self.rendezvous.close()
