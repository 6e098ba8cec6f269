"""pw.Array: a handle to a sharded buffer on the cluster, used as a jax.Array is.

Indexing, arithmetic, reshape and the other operators run as small compiled functions on the
array's own slice, and their results stay there:
- an elementwise operation (with scalars, or arrays that broadcast only along dimensions the
  array does not split) runs shard by shard, and its result keeps the array's sharding;
- anything else (indexing, reshape, transpose, matmul, reductions) runs on the whole array on
  every device of the slice (the runtime gathers it there), and its result is replicated.
Both are per-device computations without collectives, so they run on any slice, across worker
processes too.
"""
from __future__ import annotations

import collections
import operator

import numpy as np

from . import _layout

Device = collections.namedtuple("Device", ["id", "host"])
Device.__doc__ = "A device of the cluster: its id and the host (worker) it is on."


class Sharding:
    """Where an Array's shards lie, as a jax.sharding.NamedSharding says it: the slice's devices
    arranged as `mesh_shape` (row-major in rank order) with `axis_names`, and `spec`, a
    PartitionSpec over those axes."""

    def __init__(self, devices, mesh_shape, dim_to_axis, axis_names):
        self._devices = tuple(devices)
        self.mesh_shape = tuple(mesh_shape)
        self._d2a = tuple(dim_to_axis)
        self.axis_names = tuple(axis_names)
        self.spec = _layout.partition_spec(self._d2a, self.axis_names)

    @property
    def device_set(self) -> set:
        return set(self._devices)

    @property
    def devices(self) -> tuple:
        """The devices in rank order (mesh position i holds devices[i])."""
        return self._devices

    @property
    def is_fully_replicated(self) -> bool:
        return all(a < 0 for a in self._d2a)

    def shard_shape(self, global_shape) -> tuple:
        return tuple(_layout.shard_shape((None, list(global_shape), list(self.mesh_shape),
                                          list(self._d2a))))

    def devices_indices_map(self, global_shape) -> dict:
        """Each device's part of an array of `global_shape`, as a tuple of slices."""
        shard = self.shard_shape(global_shape)
        out = {}
        for i, d in enumerate(self._devices):
            coords = np.unravel_index(i, self.mesh_shape) if self.mesh_shape else ()
            idx = []
            for dim, a in enumerate(self._d2a):
                if a < 0:
                    idx.append(slice(None))
                else:
                    start = int(coords[a]) * shard[dim]
                    idx.append(slice(start, start + shard[dim]))
            out[d] = tuple(idx)
        return out

    def __repr__(self):
        return (f"Sharding(mesh={dict(zip(self.axis_names, self.mesh_shape))}, spec={self.spec}, "
                f"devices={[d.id for d in self._devices]})")


class Array:
    """A result of the runtime: a handle to a sharded buffer that stays on the devices.

    Returned before the computation finishes (dispatch is asynchronous). Pass it to another
    program to keep the data on the devices; `block_until_ready()` waits for it (raising the
    producing run's error, if any); `numpy.asarray(a)` copies it to the host.
    """

    __slots__ = ("_handle", "_value", "_conn")  # _handle goes first, before its connection.
    __array_priority__ = 100  # numpy's binary operators defer to ours (a result stays here).

    def __init__(self, handle, conn):
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
        return _layout.np_dtype(self._live().spec[0])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d Array")
        return self.shape[0]

    @property
    def sharding(self) -> Sharding:
        h = self._live()
        mesh, d2a = h.sharding
        handle, names = self._conn.slices.get(h.slice_id, (None, None))
        if handle is None or list(mesh) != list(handle.mesh_shape):
            # pmap's flat view of the slice, or another client's slice (a shared array).
            names = ("devices",) if len(mesh) == 1 else tuple(f"axis{k}" for k in range(len(mesh)))
        return Sharding([Device(d, host) for d, host in zip(h.devices, h.hosts)], mesh, d2a, names)

    def devices(self) -> set:
        return self.sharding.device_set

    def is_ready(self) -> bool:
        """Whether the run producing it has finished (or failed), as jax.Array.is_ready."""
        return self._live().is_ready()

    def delete(self) -> None:
        """Releases the array's buffers now (runs already given it still read it)."""
        self._handle = None
        self._value = None

    def is_deleted(self) -> bool:
        return self._handle is None

    def share(self, writable: bool = False, token: str | None = None) -> str:
        """A token another client of the cluster imports this array with
        (`Array.from_shared(token)`): knowing it is the permission. `writable`: its holders may
        point it at arrays of their own (`a.share(token=t)`), as this client may any of its
        tokens, to publish new values (say, each step's weights). `revoke(token)` ends it."""
        return self._live().share(writable, token or "")

    @classmethod
    def from_shared(cls, token: str, client=None) -> "Array":
        """The array a share token names now, as this client's own handle (the buffer lives while
        any client holds it). `client`: a pathways.Client (default: this process's)."""
        from . import _default_connection
        conn = client._conn if client is not None else _default_connection()
        return cls(conn.client.import_array(token), conn)

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

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export of the values on the host (jax.dlpack.from_dlpack(a), torch, ...): a
        fresh copy, since a consumer may write to what it receives and the read-back is kept
        read-only. numpy's DLPack has no bfloat16: such an array is a BufferError."""
        return np.array(self, copy=True).__dlpack__(stream=stream, max_version=max_version,
                                                    dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU, device 0: the values cross to the host.

    def __repr__(self):
        return repr(np.asarray(self))

    def __str__(self):
        return str(np.asarray(self))

    def __bool__(self):
        return bool(np.asarray(self))

    def __float__(self):
        return float(np.asarray(self))

    def __int__(self):
        return int(np.asarray(self))

    def __index__(self):
        return operator.index(np.asarray(self))

    # ---- Operations on the devices (see the module's docstring).

    def __getitem__(self, idx):
        if isinstance(idx, Array):
            return _apply("getitem", lambda x, i: x[i], (self, idx), keeps_layout=False)
        key = _static_index(idx)
        return _apply(f"getitem{key}", lambda x: x[idx], (self,), keeps_layout=False)

    def reshape(self, *shape, order="C"):
        if order != "C":
            raise NotImplementedError("reshape: only order='C'")
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return _apply(f"reshape{shape}", lambda x: x.reshape(shape), (self,), keeps_layout=False)

    def astype(self, dtype):
        dtype = np.dtype(dtype)
        _layout.checked_dtype(dtype)
        return _apply(f"astype_{dtype.name}", lambda x: x.astype(dtype), (self,))

    def transpose(self, *axes):
        axes = tuple(axes[0]) if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return _apply(f"transpose{axes}", lambda x: x.transpose(*axes), (self,), keeps_layout=False)

    @property
    def T(self):
        return self.transpose()

    def sum(self, axis=None, keepdims=False):
        return _apply(f"sum{axis}{keepdims}", lambda x: x.sum(axis=axis, keepdims=keepdims),
                      (self,), keeps_layout=False)

    def mean(self, axis=None, keepdims=False):
        return _apply(f"mean{axis}{keepdims}", lambda x: x.mean(axis=axis, keepdims=keepdims),
                      (self,), keeps_layout=False)

    def __matmul__(self, other):
        return _apply("matmul", operator.matmul, (self, other), keeps_layout=False)

    def __rmatmul__(self, other):
        return _apply("matmul", operator.matmul, (other, self), keeps_layout=False)

    def __neg__(self):
        return _apply("neg", operator.neg, (self,))

    def __abs__(self):
        return _apply("abs", abs, (self,))

    def __invert__(self):
        return _apply("invert", operator.invert, (self,))

    __hash__ = None  # As jax.Array: == is elementwise.


def _binary(name, op):
    def forward(self, other):
        return _apply(name, op, (self, other))

    def reflected(self, other):
        return _apply(name, op, (other, self))
    return forward, reflected


for _name, _op in [("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
                   ("truediv", operator.truediv), ("floordiv", operator.floordiv),
                   ("mod", operator.mod), ("pow", operator.pow), ("and", operator.and_),
                   ("or", operator.or_), ("xor", operator.xor)]:
    _f, _r = _binary(_name, _op)
    setattr(Array, f"__{_name}__", _f)
    setattr(Array, f"__r{_name}__", _r)
for _name, _op in [("lt", operator.lt), ("le", operator.le), ("gt", operator.gt),
                   ("ge", operator.ge), ("eq", operator.eq), ("ne", operator.ne)]:
    setattr(Array, f"__{_name}__", _binary(_name, _op)[0])


def _static_index(idx):
    """A hashable key of a static index (ints, slices, None, Ellipsis, numpy index arrays)."""
    parts = idx if isinstance(idx, tuple) else (idx,)
    key = []
    for p in parts:
        if isinstance(p, slice):
            key.append(("slice", p.start, p.stop, p.step))
        elif p is None or p is Ellipsis or isinstance(p, (int, np.integer, bool)):
            key.append(repr(p))
        elif isinstance(p, (list, np.ndarray)):
            a = np.asarray(p)
            key.append(("array", a.dtype.str, a.shape, a.tobytes()))
        else:
            raise TypeError(f"Array index {p!r} ({type(p).__name__}): use ints, slices, None, "
                            "Ellipsis, numpy index arrays or a pathways Array")
    return tuple(key)


def _operand(x, like: Array):
    """A non-Array operand on the host: a Python scalar takes the array's dtype where JAX's
    weak typing would (a + 1 stays float32)."""
    if type(x) in (bool, int, float, complex):
        import jax.numpy as jnp
        return np.asarray(x, jnp.result_type(like.dtype, x))
    return _layout.host_array(x)


def _result_of(name, op, args):
    """The shape and dtype of `op`'s result; a TypeError naming the operation if it has none."""
    import jax
    try:
        with jax.enable_x64(any(_layout.checked_dtype(x.dtype) in _layout.WIDE for x in args)):
            return jax.eval_shape(op, *[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in args])
    except Exception as e:  # JAX's own message says what is wrong.
        raise TypeError(f"Array {name}: {str(e).splitlines()[0]}") from None


def _shard_wise(result, args, shape, d2a):
    """Whether an operation can run shard by shard on an array of `shape` split by `d2a`: its
    result has the array's shape, and every other operand has that shape or broadcasts (from
    the right) only along dimensions the array does not split."""
    if tuple(result.shape) != tuple(shape):
        return False
    for x in args:
        if tuple(x.shape) == tuple(shape):
            continue
        offset = len(shape) - len(x.shape)
        if offset < 0 or any(d2a[d] >= 0 and x.shape[d - offset] != 1
                             for d in range(offset, len(shape))):
            return False
    return True


def _apply(name, op, operands, keeps_layout=True):
    """Runs `op` (a jittable function of the operands) on the slice of the first Array operand;
    see the module's docstring for how it is laid out."""
    import jax
    from ._functions import _Program
    a = next(x for x in operands if isinstance(x, Array))
    args = [x if isinstance(x, Array) else _operand(x, a) for x in operands]
    conn = a._conn
    if a._live().slice_id not in conn.slices:
        raise ValueError(f"Array {name}: this array was shared with this client and lies on "
                         "another client's slice; operations run on the array's slice, so pass "
                         "it to a function bound to a slice of this client's instead")
    mesh, d2a = a._live().sharding
    result = _result_of(name, op, args)
    shard_wise = keeps_layout and _shard_wise(result, args, a.shape, d2a)
    layouts = []
    for x in args:
        dtype = _layout.checked_dtype(x.dtype)
        if shard_wise and tuple(x.shape) == a.shape:
            layouts.append((dtype, list(x.shape), list(mesh), list(d2a)))
        else:
            layouts.append((dtype, list(x.shape), list(mesh), [-1] * len(x.shape)))
    # The result: laid out as the array (shard by shard) or replicated.
    result = (list(a.shape), list(mesh), list(d2a)) if shard_wise else (None, list(mesh), None)
    key = (name, a._handle.slice_id, tuple((l[0], tuple(l[1]), tuple(l[2]), tuple(l[3]))
                                           for l in layouts), shard_wise)
    program = conn.ops.get(key)
    if program is None:
        program = _Program(_LaidOut(name, op, a._handle.slice_id, conn, layouts, result), conn=conn)
        conn.ops[key] = program
    return program(*args)


class _LaidOut:
    """An Array operation bound to a slice with given input layouts (per-device, no
    collectives); called with traced values inside the one-node program that runs it."""

    def __init__(self, name, op, slice_id, conn, layouts, result):
        self.__name__ = name
        self._op = op
        self._slice_id = slice_id
        self._conn = conn
        self._layouts = layouts
        self._result = result  # (global shape, mesh, dim_to_axis); shape None: replicated.
        self._bound = None

    def __call__(self, *values):
        if self._bound is None:
            self._bound = self._bind()
        return self._bound(list(values))[0]

    def _bind(self):
        import jax
        handle, _ = self._conn.slices[self._slice_id]  # One of this client's (see _apply).
        shard_ins = [(l[0], _layout.shard_shape(l)) for l in self._layouts]
        avals = [jax.ShapeDtypeStruct(tuple(s), _layout.np_dtype(d)) for d, s in shard_ins]
        with jax.enable_x64(any(d in _layout.WIDE for d, _ in shard_ins)):
            exported = jax.export.export(jax.jit(self._op))(*avals)
        (out,) = exported.out_avals
        dtype = _layout.checked_dtype(out.dtype)
        shape, mesh, d2a = self._result
        if shape is not None:  # Shard by shard: the result is laid out as the array is.
            out_layout = (dtype, shape, mesh, d2a)
        else:
            out_layout = (dtype, list(out.shape), mesh, [-1] * len(out.shape))
        return self._conn.client.bind_stablehlo(
            self.__name__, exported.mlir_module_serialized, shard_ins,
            [(dtype, list(out.shape))], handle, 1, 0, self._layouts, [out_layout])
