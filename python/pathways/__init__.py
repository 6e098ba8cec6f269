"""pathways: the Python/JAX client of a single-controller dataflow runtime (Barham et al. 2022).

The paper's programming model:

    device_set = pw.make_virtual_device_set()
    slice = device_set.add_slice(devices=2)
    a = pw.pmap(lambda x: x * 2., devices=slice)     # a JAX function bound to a slice
    @pw.program                                       # traced into one dataflow program
    def f(v):
        return a(v)
    f(numpy.array([1., 2.]))

Functions are exported with jax.export to StableHLO and compiled by XLA (a PJRT plugin) on the
runtime's workers. Programs run on an embedded cluster in this process, or on a running cluster
(`pw up`) when PW_CLUSTER names one or after `pw.connect(address)`.
"""
from __future__ import annotations

import collections
import os
import threading

import numpy as np

from . import _collectives, _pathways, errors

__all__ = ["connect", "make_virtual_device_set", "pmap", "program", "device_put", "Array", "VirtualDeviceSet", "Slice"]

_lock = threading.Lock()


# A cluster (embedded, or a gRPC channel to one) and this process's client of it. Every object
# made through it (slices, bound functions, programs, arrays) holds it, so it lives while any of
# them does: a later pw.connect() or the interpreter's exit cannot free a client under an array
# still referenced. A tuple on purpose: the garbage collector never clears a tuple, so at exit it
# goes only once the last array holding it has released its buffer (an Array's handle is its
# first slot, released before its connection).
_Connection = collections.namedtuple("_Connection", ["cluster", "client"])


_conn: _Connection | None = None


def connect(address: str | None = None, token: str | None = None) -> str:
    """Uses a running cluster from now on: `address`, else $PW_CLUSTER, else the cluster `pw up`
    started most recently. Returns the address. Call before using any slice or array."""
    global _conn
    resolved = _pathways.cluster_address(address or "")
    if not resolved:
        raise RuntimeError("no cluster to connect to: pass an address, set PW_CLUSTER, or run `pw up`")
    remote = _pathways.RemoteCluster.dial(resolved, token if token is not None else os.environ.get("PW_TOKEN", ""))
    conn = _Connection(remote, _pathways.Client.connect_remote(remote, "python"))
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
            _conn = _Connection(cluster, _pathways.Client.connect(cluster, "python"))
        return _conn


class Slice:
    """A virtual slice of devices: where it lies (`devices`, `hosts`, `islands`), `release()`;
    a context manager that releases it on exit."""

    def __init__(self, handle, conn: _Connection):
        self._handle = handle
        self._conn = conn

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
        return f"Slice(devices={self.devices}, hosts={self.hosts}, islands={self.islands})"


class VirtualDeviceSet:
    def __init__(self, conn: _Connection):
        self._conn = conn

    def add_slice(self, devices: int | None = None, tpu_devices: int | None = None,
                  placement: str = "island") -> Slice:
        """N devices: all in one island ("island", the default), on one host ("host"), or over
        as many hosts as possible, across islands if need be ("spread")."""
        n = devices if devices is not None else tpu_devices
        if n is None:
            raise ValueError("add_slice needs devices=N")
        return Slice(self._conn.client.add_slice(int(n), placement), self._conn)


def make_virtual_device_set() -> VirtualDeviceSet:
    return VirtualDeviceSet(_default_connection())


# numpy's dtype name -> the runtime's. bfloat16 is ml_dtypes' (JAX's) numpy type.
_DTYPES = {"float32": "f32", "float64": "f64", "int32": "s32", "int64": "s64", "bool": "pred",
           "uint8": "u8", "int8": "s8", "float16": "f16", "uint32": "u32", "bfloat16": "bf16",
           "int16": "s16", "uint16": "u16", "uint64": "u64", "complex64": "c64"}


def _checked_dtype(dtype) -> str:
    """The runtime's name of a numpy dtype, or a TypeError naming it and what is supported."""
    name = np.dtype(dtype).name
    if name not in _DTYPES:
        raise TypeError(f"dtype {name} is not supported by pathways; supported: "
                        f"{', '.join(sorted(_DTYPES))}")
    return _DTYPES[name]


def _spec(shape, dtype):
    return (_checked_dtype(dtype), list(shape))


def _raw(x):
    """What the extension takes for a host array: its bytes (a flat uint8 view: any dtype,
    read-only or not), the runtime's dtype name and the shape. `x` must be C-contiguous."""
    return x.reshape(-1).view(np.uint8), _checked_dtype(x.dtype), list(x.shape)


class Array:
    """A result of the runtime: a handle to a sharded buffer that stays on the devices.

    Returned before the computation finishes (dispatch is asynchronous). Pass it to another
    program to keep the data on the devices; `block_until_ready()` waits for it (raising the
    producing run's error, if any); `numpy.asarray(a)` copies it to the host.
    """

    __slots__ = ("_handle", "_value", "_conn")  # _handle goes first, before its connection.

    def __init__(self, handle, conn: _Connection):
        self._handle = handle
        self._value = None
        self._conn = conn

    def _live(self):
        if self._handle is None:
            raise RuntimeError("Array has been deleted")
        return self._handle

    @property
    def shape(self) -> tuple:
        return tuple(self._live().spec[1])

    @property
    def dtype(self) -> np.dtype:
        return _np_dtype(self._live().spec[0])

    def is_ready(self) -> bool:
        """Whether the run producing it has finished (or failed), as jax.Array.is_ready."""
        return self._live().is_ready()

    def delete(self) -> None:
        """Releases the array's buffers now (runs already given it still read it)."""
        self._handle = None
        self._value = None

    def is_deleted(self) -> bool:
        return self._handle is None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def block_until_ready(self) -> "Array":
        self._live().wait()
        return self

    def __array__(self, dtype=None, copy=None):
        """The values on the host, read once and kept read-only (as jax.Array's); `copy=True`
        returns a writable copy; `copy=False` works when no conversion is asked for."""
        if self._value is None:
            value = self._live().to_numpy().view(self.dtype).reshape(self.shape)
            value.flags.writeable = False
            self._value = value
        if dtype is not None and np.dtype(dtype) != self._value.dtype:
            if copy is False:
                raise ValueError(f"converting {self._value.dtype} to {np.dtype(dtype)} needs a copy")
            return self._value.astype(dtype)
        return self._value.copy() if copy else self._value

    def __repr__(self):
        return repr(np.asarray(self))

    def __str__(self):
        return str(np.asarray(self))


class _Pmapped:
    """A JAX function mapped over a slice: one shard per device along the leading axis.

    Without an axis name each shard is computed alone (one per-shard XLA computation, compiled
    once). With one, the function may use collectives over that axis (jax.lax.psum, all_gather,
    ...): it is exported as one SPMD computation over the slice's devices (jax.shard_map).
    Arguments and results may be pytrees of arrays.
    """

    def __init__(self, fn, devices: Slice, axis_name=None):
        self._fn = fn
        self._slice = devices
        self._axis = axis_name
        self._bound = {}  # (per-shard input specs, input tree) -> (BoundFunction, output tree)
        self._name = getattr(fn, "__name__", "fn").replace("<lambda>", "lambda")
        self._op_program = None

    def _export(self, tree, shard_specs):
        import jax
        n = self._slice.num_devices
        out_tree = {}

        def flat_fn(*leaves):  # One shard's view.
            out = self._fn(*jax.tree_util.tree_unflatten(tree, leaves))
            flat, out_tree["tree"] = jax.tree_util.tree_flatten(out)
            return flat

        with jax.enable_x64(any(d in ("f64", "s64", "u64") for d, _ in shard_specs)):
            if self._axis is None:
                args = [jax.ShapeDtypeStruct(tuple(s), _np_dtype(d)) for d, s in shard_specs]
                exported = jax.export.export(jax.jit(flat_fn))(*args)
                outs = [_spec(a.shape, a.dtype) for a in exported.out_avals]
            else:
                from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P
                mesh = AbstractMesh((n,), (self._axis,))

                def per_device(*blocks):  # Partition i holds row i: pmap's view of it.
                    return [y[None] for y in flat_fn(*(b[0] for b in blocks))]

                # check_vma=False: pmap's typing (no varying/invariant distinction).
                mapped = jax.shard_map(per_device, mesh=mesh, in_specs=P(self._axis),
                                       out_specs=P(self._axis), check_vma=False)
                args = [jax.ShapeDtypeStruct((n, *s), _np_dtype(d),
                                             sharding=NamedSharding(mesh, P(self._axis)))
                        for d, s in shard_specs]
                # One shard's body, its collectives made the runtime's (see _collectives.py),
                # exported as a single-device module that runs in any worker process.
                body = _collectives.shard_map_body(jax.make_jaxpr(jax.jit(mapped))(*args))
                shard = _collectives.per_shard_function(body, self._axis, n)

                def per_shard(*xs):
                    return [y[0] for y in shard(*(x[None] for x in xs))]

                shard_args = [jax.ShapeDtypeStruct(tuple(s), _np_dtype(d)) for d, s in shard_specs]
                exported = jax.export.export(
                    jax.jit(per_shard), disabled_checks=_collectives.export_checks())(*shard_args)
                outs = [_spec(a.shape, a.dtype) for a in exported.out_avals]
        return exported.mlir_module_serialized, outs, out_tree["tree"]

    def _bind(self, tree, shard_specs):
        key = (tree, tuple((d, tuple(s)) for d, s in shard_specs))
        if key not in self._bound:
            module, outs, out_tree = self._export(tree, shard_specs)
            axis_size = 0 if self._axis is None else self._slice.num_devices
            bound = self._slice._conn.client.pmap_stablehlo(
                self._name, module, list(shard_specs), outs, self._slice._handle, 1, axis_size)
            self._bound[key] = (bound, out_tree)
        return self._bound[key]

    def __call__(self, *args, timeout: float | None = None):
        import jax
        leaves, tree = jax.tree_util.tree_flatten(args)
        if leaves and all(isinstance(a, _pathways.Value) for a in leaves):
            if timeout is not None:
                raise ValueError(f"{self._name}: timeout= is for a call outside @pw.program; "
                                 "give it to the program's call")
            shard_specs = []
            for a in leaves:
                dtype, shape = a.spec
                if not shape:
                    raise ValueError(f"{self._name}: pmap needs a leading device axis; "
                                     f"got a scalar argument")
                shard_specs.append((dtype, list(shape)[1:]))  # pmap: drop the device axis
            bound, out_tree = self._bind(tree, shard_specs)
            return jax.tree_util.tree_unflatten(out_tree, bound(leaves))
        # Outside a program: run as its own one-node program (traced once per input specs).
        if self._op_program is None:
            op = lambda *a: self(*a)  # noqa: E731
            op.__name__ = self._name
            self._op_program = _Program(op)
        return self._op_program(*args, timeout=timeout)


def _np_dtype(name: str):
    if name == "bf16":
        import ml_dtypes  # JAX's numpy dtypes (a dependency of jax).
        return np.dtype(ml_dtypes.bfloat16)
    for k, v in _DTYPES.items():
        if v == name:
            return np.dtype(k)
    raise ValueError(f"unknown dtype {name}")


def pmap(fn, devices: Slice, axis_name=None):
    """Binds a jittable JAX function to a slice, pmap-style (leading axis = devices).

    With `axis_name`, the function may use collectives over that axis, as under jax.pmap.
    """
    return _Pmapped(fn, devices, axis_name)


class _Program:
    def __init__(self, fn):
        self._fn = fn
        self._programs = {}
        self._name = getattr(fn, "__name__", "program").replace("<lambda>", "lambda")

    @staticmethod
    def _leaves(args):
        import jax
        leaves, tree = jax.tree_util.tree_flatten(args)
        out = []
        for a in leaves:
            if isinstance(a, Array):
                out.append(a)
            else:
                a = np.ascontiguousarray(np.asarray(a))
                _checked_dtype(a.dtype)
                out.append(a)
        return out, tree

    def _trace(self, leaves, tree):
        import jax
        specs = [(a._live().spec[0], list(a.shape)) if isinstance(a, Array)
                 else _spec(a.shape, a.dtype) for a in leaves]
        conn = _default_connection()
        key = (id(conn), tree, tuple((d, tuple(s)) for d, s in specs))
        if key not in self._programs:
            structure = {}

            def body(values):
                out = self._fn(*jax.tree_util.tree_unflatten(tree, values))
                flat, structure["tree"] = jax.tree_util.tree_flatten(out)
                return flat

            prog = conn.client.trace(self._name, specs, body)
            self._programs[key] = (prog, structure["tree"], conn)
        return self._programs[key]

    def explain(self, *args) -> str:
        leaves, tree = self._leaves(args)
        return self._trace(leaves, tree)[0].explain()

    def __call__(self, *args, timeout: float | None = None):
        """Runs the program; returns its results as soon as it is dispatched.

        `timeout` (seconds): the run is cancelled if it has not finished by then, and reading its
        results raises pathways.errors.DeadlineExceeded (default: the cluster's run timeout).
        """
        import jax
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        leaves, tree = self._leaves(args)
        prog, out_tree, conn = self._trace(leaves, tree)
        handles = [a._live() if isinstance(a, Array) else prog.put_arg(i, *_raw(a))
                   for i, a in enumerate(leaves)]
        outs = [Array(h, conn) for h in prog.run(handles, timeout or 0.0)]
        return jax.tree_util.tree_unflatten(out_tree, outs)


def device_put(x, devices: Slice) -> Array:
    """Puts a numpy array on a slice, pmap-style: row i of the leading axis on device i."""
    x = np.ascontiguousarray(np.asarray(x))
    return Array(devices._conn.client.put(devices._handle, *_raw(x)), devices._conn)


def program(fn):
    """Traces calls of pmapped functions inside `fn` into one dataflow program.

    Arguments are numpy arrays or `Array`s (pytrees of them); results are `Array`s, returned as
    soon as the program is dispatched.
    """
    return _Program(fn)
