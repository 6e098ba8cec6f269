"""pathways: the Python/JAX client of a single-controller dataflow runtime (Barham et al. 2022).

The paper's programming model:

    device_set = pw.make_virtual_device_set()
    slice = device_set.add_slice(devices=2)
    a = pw.pmap(lambda x: x * 2., devices=slice)     # a JAX function bound to a slice
    @pw.program                                       # traced into one dataflow program
    def f(v):
        return a(v)
    f(numpy.array([1., 2.]))

pw.pmap takes jax.pmap's in_axes, out_axes, static_broadcasted_argnums and donate_argnums;
pw.jit(fn, devices=slice, in_shardings=PartitionSpec(...)) compiles a function of global arrays
for the slice's mesh (add_slice(mesh=(2, 2), axis_names=("data", "model"))). docs/python.md
sets the API beside jax.pmap and jax.jit.

Functions are exported with jax.export to StableHLO and compiled by XLA (a PJRT plugin) on the
runtime's workers. Programs run on an embedded cluster in this process, or on a running cluster
(`pw up`) when PW_CLUSTER names one or after `pw.connect(address)`.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import threading

import numpy as np

from . import _layout, _pathways, errors
from ._array import Array, Device, Sharding
from ._functions import Jitted, Pmapped, _Program
from . import checkpoint

__all__ = ["connect", "make_virtual_device_set", "pmap", "jit", "program", "device_put", "status",
           "revoke", "serve_metrics", "trace", "checkpoint", "Client", "Array", "Device", "Sharding",
           "VirtualDeviceSet", "Slice"]

_lock = threading.Lock()


# A cluster (embedded, or a gRPC channel to one) and this process's client of it, with the
# slices it made (id -> (handle, axis names), for Array.sharding) and its Array operations' bound
# functions. Every object made through it (slices, bound functions, programs, arrays) holds it,
# so it lives while any of them does: a later pw.connect() or the interpreter's exit cannot free
# a client under an array still referenced. A tuple on purpose: the garbage collector never
# clears a tuple, so at exit it goes only once the last array holding it has released its buffer
# (an Array's handle is its first slot, released before its connection).
_Connection = collections.namedtuple("_Connection", ["cluster", "client", "slices", "ops"])


_conn: _Connection | None = None


def _connection(cluster, client) -> _Connection:
    return _Connection(cluster, client, {}, {})


def connect(address: str | None = None, token: str | None = None, *, tenant: str | None = None,
            share: float | None = None) -> str:
    """Uses a running cluster from now on: `address`, else $PW_CLUSTER, else the cluster `pw up`
    started most recently. Returns the address. Call before using any slice or array.

    `tenant` (else $PW_TENANT; else a tenant of this client's own) is whose share of each
    island's device time pays for this client's work, with `share` (else $PW_SHARE; else the
    tenant's, 1 for a new one) unless the cluster's admin set it (`pw tenant set`)."""
    global _conn
    resolved = _pathways.cluster_address(address or "")
    if not resolved:
        raise RuntimeError("no cluster to connect to: pass an address, set PW_CLUSTER, or run `pw up`")
    remote = _pathways.RemoteCluster.dial(resolved, token if token is not None else os.environ.get("PW_TOKEN", ""))
    conn = _connection(remote, _pathways.Client.connect_remote(
        remote, "python", tenant=tenant or "", share=float(share or 0)))
    with _lock:
        _conn = conn
    return resolved


def _default_connection() -> _Connection:
    """The cluster at $PW_CLUSTER if set, else an embedded cluster in this process
    (PW_ISLANDS x PW_HOSTS_PER_ISLAND x PW_DEVICES_PER_HOST)."""
    global _conn
    if _conn is None and os.environ.get("PW_CLUSTER"):
        connect(os.environ["PW_CLUSTER"])
    with _lock:
        if _conn is None:
            cluster = _pathways.EmbeddedCluster.create(
                int(os.environ.get("PW_ISLANDS", "2")),
                int(os.environ.get("PW_HOSTS_PER_ISLAND", "1")),
                int(os.environ.get("PW_DEVICES_PER_HOST", "4")))
            _conn = _connection(cluster, _pathways.Client.connect(cluster, "python"))
        return _conn


class Client:
    """Another client of this process's cluster, with its own slices, functions and arrays (as
    a second process would have): a tenant beside the default one, e.g. a server sharing a
    trainer's weights. Closed (its slices and arrays released) by close() or on exit."""

    def __init__(self, name: str = "python", *, tenant: str | None = None,
                 share: float | None = None):
        """`tenant` and `share` as pw.connect's."""
        cluster = _default_connection().cluster
        if isinstance(cluster, _pathways.EmbeddedCluster):
            client = _pathways.Client.connect(cluster, name, tenant=tenant or "",
                                              share=float(share or 0))
        else:
            client = _pathways.Client.connect_remote(cluster, name, tenant=tenant or "",
                                                     share=float(share or 0))
        self._conn = _connection(cluster, client)

    def make_virtual_device_set(self) -> "VirtualDeviceSet":
        return VirtualDeviceSet(self._conn)

    def revoke(self, token: str) -> None:
        self._conn.client.revoke(token)


def revoke(token: str, client: Client | None = None) -> None:
    """Ends a share this client made (`Array.share`): the array can no longer be imported with
    the token, and clients that imported it through the token lose it (their next use fails with
    NotFound)."""
    (client._conn if client is not None else _default_connection()).client.revoke(token)


_metrics_servers = []  # Embedded clusters' metrics endpoints, serving while this process runs.


def serve_metrics(port: int = 0, host: str = "127.0.0.1") -> str:
    """Serves this process's embedded cluster's Prometheus metrics (those `pw controller` and
    `pw worker` serve, pw/metrics/README.md) at http://host:port/metrics (port 0: a free one) and
    returns "host:port". On a running cluster, returns its controller's endpoint (`pw up` serves
    one for every process; pw.status() lists the hosts')."""
    conn = _default_connection()
    if isinstance(conn.cluster, _pathways.EmbeddedCluster):
        server = conn.cluster.serve_metrics(f"{host}:{int(port)}")
        _metrics_servers.append(server)
        return server.address
    address = status().get("metrics_address")
    if not address:
        raise RuntimeError("the cluster's controller serves no metrics (pw controller --metrics-port)")
    return address


@contextlib.contextmanager
def trace(path: str, *, all_tenants: bool | None = None, client: Client | None = None):
    """Records a timeline of the cluster while the block runs and writes it to `path` as Chrome
    trace JSON (open it in the Perfetto UI, ui.perfetto.dev, or chrome://tracing): this client's
    calls, the controller's submits, each island scheduler's gang order, each host's dispatch and
    transfers (bytes, ICI or DCN), each device's computations, collectives and waits (memory,
    compile), linked by flow arrows, on the controller's clock (pw/trace/README.md).
    Other clients' spans are anonymous unless `all_tenants` (default: True for an embedded
    cluster, which is this process's; on a running cluster it needs the cluster token). A block
    that raises still writes the trace."""
    conn = client._conn if client is not None else _default_connection()
    if all_tenants is None:
        all_tenants = isinstance(conn.cluster, _pathways.EmbeddedCluster)
    conn.client.start_trace()
    try:
        yield
    finally:
        text = conn.client.stop_trace(all_tenants)
        with open(path, "w") as f:
            f.write(text)


def status() -> dict:
    """The cluster's status, as `pw status --json` prints it: clients, runs, buffers, and per
    host its island, buffers, transfers, compiled functions and devices (memory, queues). For an
    embedded cluster every host reads as "in-process"; one that failed (a drill: the cluster's
    fail_host) is not "alive", and says why in "reason", as on a process cluster."""
    return json.loads(_default_connection().cluster.status_json())


class Slice:
    """A virtual slice of devices: where it lies (`devices`, `hosts`, `islands`), its mesh
    (`mesh_shape`, `axis_names`), `release()`; a context manager that releases it on exit."""

    def __init__(self, handle, conn: _Connection, axis_names):
        self._handle = handle
        self._conn = conn
        self._axis_names = tuple(axis_names)

    @property
    def num_devices(self) -> int:
        return self._handle.num_devices

    @property
    def devices(self) -> list[int]:
        """Physical device ids in rank order."""
        return list(self._handle.devices)

    @property
    def hosts(self) -> list[int]:
        """The host (worker) of each device, in rank order."""
        return list(self._handle.hosts)

    @property
    def islands(self) -> list[int]:
        return list(self._handle.islands)

    @property
    def mesh_shape(self) -> tuple:
        return tuple(self._handle.mesh_shape)

    @property
    def axis_names(self) -> tuple:
        return self._axis_names

    @property
    def mesh(self):
        """The slice's mesh as a jax.sharding.AbstractMesh (for PartitionSpecs and shard_map)."""
        from jax.sharding import AbstractMesh
        return AbstractMesh(self.mesh_shape, self._axis_names)

    def release(self) -> None:
        self._handle.release()

    def __enter__(self) -> "Slice":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    @property
    def tpus(self) -> "Slice":  # The paper's spelling: add_slice(tpu_devices=n).tpus
        return self

    def __repr__(self):
        return (f"Slice(devices={self.devices}, hosts={self.hosts}, islands={self.islands}, "
                f"mesh={dict(zip(self._axis_names, self.mesh_shape))})")


def _ids(x, what):
    if x is None:
        return []
    ids = [x] if isinstance(x, int) else list(x)
    if not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ValueError(f"add_slice: {what} must be non-negative ints, got {x!r}")
    return ids


class VirtualDeviceSet:
    def __init__(self, conn: _Connection):
        self._conn = conn

    def add_slice(self, devices: int | None = None, tpu_devices: int | None = None,
                  placement: str = "island", *, mesh=None, axis_names=None, island=None,
                  hosts=None, avoid=None) -> Slice:
        """A slice of `devices` devices (or of `mesh`'s product), refused at once if it cannot
        be placed as asked.

        placement: all in one island, on as few hosts as loads allow ("island", the default), on one host ("host"), or over as
            many hosts as possible, across islands if need be ("spread").
        mesh, axis_names: the devices as a mesh, for pw.jit's PartitionSpecs (default: one axis
            named "devices").
        island, hosts: only these islands / hosts (an int or a list). avoid: a Slice (or a
            list) whose islands this one must not use (an MPMD pipeline's next stage).
        """
        n = devices if devices is not None else tpu_devices
        mesh = tuple(int(m) for m in mesh) if mesh is not None else None
        if n is None and mesh is not None:
            n = int(np.prod(mesh))
        if n is None:
            raise ValueError("add_slice needs devices=N (or mesh=)")
        if mesh is not None and int(np.prod(mesh)) != n:
            raise ValueError(f"add_slice: mesh {mesh} holds {int(np.prod(mesh))} devices, not {n}")
        if axis_names is None:
            if mesh is not None and len(mesh) != 1:
                raise ValueError(f"add_slice: a mesh of {len(mesh)} axes needs axis_names=")
            axis_names = ("devices",)
        axis_names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
        if len(axis_names) != (len(mesh) if mesh is not None else 1) or len(set(axis_names)) != len(axis_names):
            raise ValueError(f"add_slice: axis_names {axis_names} must name each axis of the "
                             f"mesh {mesh or (n,)} once")
        avoid = [avoid] if isinstance(avoid, Slice) else list(avoid or [])
        if not all(isinstance(s, Slice) for s in avoid):
            raise TypeError("add_slice: avoid= takes a Slice or a list of Slices")
        handle = self._conn.client.add_slice(
            int(n), placement, list(mesh or []), _ids(island, "island"), _ids(hosts, "hosts"),
            sorted({i for s in avoid for i in s.islands}))
        self._conn.slices[handle.id] = (handle, axis_names)
        return Slice(handle, self._conn, axis_names)


def make_virtual_device_set() -> VirtualDeviceSet:
    return VirtualDeviceSet(_default_connection())


def pmap(fn, devices: Slice, axis_name=None, *, in_axes=0, out_axes=0,
         static_broadcasted_argnums=(), donate_argnums=()):
    """Binds a jittable JAX function to a slice as jax.pmap maps it over devices.

    in_axes / out_axes: as jax.pmap's (an int or None per argument / result, or pytree prefixes:
        None broadcasts an argument to every device, or returns one value).
    axis_name: the function may use collectives over that axis (psum, all_gather, ...), which the
        runtime runs across worker processes.
    static_broadcasted_argnums: arguments that are Python values fixed at bind time (hashable).
    donate_argnums: arguments deleted once the call is dispatched (their buffers are freed when
        the run has read them).
    """
    return Pmapped(fn, devices, axis_name, in_axes, out_axes, static_broadcasted_argnums,
                   donate_argnums)


def jit(fn, devices: Slice, in_shardings=None, out_shardings=None, *, static_argnums=(),
        donate_argnums=()):
    """Compiles a JAX function of global arrays for a slice's mesh, as jax.jit with shardings.

    in_shardings / out_shardings: a PartitionSpec (or NamedSharding over the slice's mesh) for
    all, or a pytree prefix of them per argument / of the result; None replicates. XLA's SPMD
    partitioner inserts the collectives, which meet inside one host's PJRT client: a
    multi-device slice for pw.jit must lie on one host (placement="host"), on the embedded
    cluster as on a process cluster.
    """
    return Jitted(fn, devices, in_shardings, out_shardings, static_argnums, donate_argnums)


def device_put(x, devices: Slice, sharding=None) -> Array:
    """Puts an array on a slice: pmap-style by default (row i of the leading axis on device i),
    or laid out by `sharding`, a PartitionSpec over the slice's mesh axes. A large numpy array
    is sent from its own memory, so another thread must not write to it until this returns."""
    x = _layout.host_array(x)
    if sharding is None:
        if x.ndim == 0:
            raise ValueError("device_put needs a leading device axis (or sharding=); got a scalar")
        mesh, d2a = [devices.num_devices], [0] + [-1] * (x.ndim - 1)
    else:
        spec = getattr(sharding, "spec", sharding)
        mesh = list(devices.mesh_shape)
        d2a = _layout.dim_to_axis(spec, x.ndim, devices.axis_names, "device_put")
    return Array(devices._conn.client.put(devices._handle, *_layout.raw(x), mesh, d2a),
                 devices._conn)


def program(fn=None, *, donate_argnums=()):
    """Traces calls of pmapped and jitted functions inside `fn` into one dataflow program.

    Arguments are arrays (numpy, jax.Array, scalars) or `Array`s (pytrees of them); results are
    `Array`s, returned as soon as the program is dispatched. `donate_argnums`: Array arguments
    deleted once the run is dispatched.
    """
    if fn is None:
        return lambda f: _Program(f, donate_argnums)
    return _Program(fn, donate_argnums)
