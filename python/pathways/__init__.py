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
runtime's workers; programs run on an embedded cluster in this process.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from . import _pathways

__all__ = ["make_virtual_device_set", "pmap", "program", "VirtualDeviceSet", "Slice"]

_lock = threading.Lock()
_cluster = None
_client = None


def _default_client():
    """The embedded cluster of this process (PW_ISLANDS x PW_HOSTS_PER_ISLAND x PW_DEVICES_PER_HOST)."""
    global _cluster, _client
    with _lock:
        if _client is None:
            _cluster = _pathways.EmbeddedCluster.create(
                int(os.environ.get("PW_ISLANDS", "2")),
                int(os.environ.get("PW_HOSTS_PER_ISLAND", "1")),
                int(os.environ.get("PW_DEVICES_PER_HOST", "4")))
            _client = _pathways.Client.connect(_cluster, "python")
        return _client


class Slice:
    """A virtual slice of devices in one island."""

    def __init__(self, handle):
        self._handle = handle

    @property
    def num_devices(self) -> int:
        return self._handle.num_devices

    @property
    def tpus(self) -> "Slice":  # The paper's spelling: add_slice(tpu_devices=n).tpus
        return self

    def __repr__(self):
        return f"Slice(devices={self._handle.devices})"


class VirtualDeviceSet:
    def __init__(self, client):
        self._client = client

    def add_slice(self, devices: int | None = None, tpu_devices: int | None = None,
                  single_island: bool = True) -> Slice:
        n = devices if devices is not None else tpu_devices
        if n is None:
            raise ValueError("add_slice needs devices=N")
        return Slice(self._client.add_slice(int(n), single_island))


def make_virtual_device_set() -> VirtualDeviceSet:
    return VirtualDeviceSet(_default_client())


_DTYPES = {"float32": "f32", "float64": "f64", "int32": "s32", "int64": "s64", "bool": "pred",
           "uint8": "u8", "int8": "s8", "float16": "f16", "uint32": "u32"}


def _spec(shape, dtype):
    return (_DTYPES[np.dtype(dtype).name], list(shape))


class _Pmapped:
    """A JAX function mapped over a slice: one shard per device along the leading axis."""

    def __init__(self, fn, devices: Slice):
        self._fn = fn
        self._slice = devices
        self._bound = {}  # per-shard input specs -> BoundFunction
        self._name = getattr(fn, "__name__", "fn").replace("<lambda>", "lambda")

    def _bind(self, shard_specs):
        key = tuple((d, tuple(s)) for d, s in shard_specs)
        if key not in self._bound:
            import jax
            with jax.enable_x64(any(d in ("f64", "s64") for d, _ in shard_specs)):
                args = [jax.ShapeDtypeStruct(tuple(s), _np_dtype(d)) for d, s in shard_specs]
                exported = jax.export.export(jax.jit(self._fn))(*args)
            outs = [_spec(a.shape, a.dtype) for a in exported.out_avals]
            self._bound[key] = _default_client().pmap_stablehlo(
                self._name, exported.mlir_module_serialized, list(shard_specs), outs,
                self._slice._handle)
        return self._bound[key]

    def __call__(self, *args):
        if args and all(isinstance(a, _pathways.Value) for a in args):
            shard_specs = []
            for a in args:
                dtype, shape = a.spec
                shard_specs.append((dtype, list(shape)[1:]))  # pmap: drop the device axis
            outs = self._bind(shard_specs)(list(args))
            return outs[0] if len(outs) == 1 else tuple(outs)
        # Outside a program: run as its own one-node program.
        return program(self)(*args)


def _np_dtype(name: str):
    for k, v in _DTYPES.items():
        if v == name:
            return np.dtype(k)
    raise ValueError(f"unknown dtype {name}")


def pmap(fn, devices: Slice):
    """Binds a jittable JAX function to a slice, pmap-style (leading axis = devices)."""
    return _Pmapped(fn, devices)


class _Program:
    def __init__(self, fn):
        self._fn = fn
        self._programs = {}
        self._name = getattr(fn, "__name__", "program")

    def _trace(self, arrays):
        key = tuple((a.dtype.str, a.shape) for a in arrays)
        if key not in self._programs:
            structure = {}

            def body(values):
                out = self._fn(*values)
                structure["tuple"] = isinstance(out, tuple)
                return list(out) if isinstance(out, tuple) else [out]

            specs = [_spec(a.shape, a.dtype) for a in arrays]
            prog = _default_client().trace(self._name, specs, body)
            self._programs[key] = (prog, structure["tuple"])
        return self._programs[key]

    def explain(self, *args) -> str:
        return self._trace([np.ascontiguousarray(a) for a in args])[0].explain()

    def __call__(self, *args):
        arrays = [np.ascontiguousarray(np.asarray(a)) for a in args]
        prog, is_tuple = self._trace(arrays)
        outs = prog.call(arrays)
        return tuple(outs) if is_tuple else outs[0]


def program(fn):
    """Traces calls of pmapped functions inside `fn` into one dataflow program."""
    return _Program(fn)
