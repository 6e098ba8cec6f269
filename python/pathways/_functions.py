"""pw.pmap, pw.jit and pw.program: JAX functions bound to slices, and programs of them.

A bound function is exported with jax.export (StableHLO) once per argument layout and
registered with the cluster, whose workers compile it with XLA. Called with traced values (inside
@pw.program) it records a node; called with arrays it runs at once as its own one-node program.
"""
from __future__ import annotations

import numpy as np

from . import _collectives, _layout, _pathways


def _name_of(fn, default):
    return getattr(fn, "__name__", default).replace("<lambda>", "lambda")


def _argnums(nums, what):
    nums = (nums,) if isinstance(nums, int) else tuple(nums or ())
    if not all(isinstance(i, int) and i >= 0 for i in nums):
        raise ValueError(f"{what} must be non-negative ints, got {nums!r}")
    return frozenset(nums)


class _Bound:
    """What pw.pmap and pw.jit share: static arguments, the cache of bindings (one per input
    layout and static values), the call inside a program and the op-by-op call outside one."""

    def __init__(self, fn, slice_, static_argnums, donate_argnums, kind):
        from . import Slice
        if not isinstance(slice_, Slice):
            raise TypeError(f"{kind}: devices= must be a pathways Slice "
                            f"(make_virtual_device_set().add_slice(...)), got {type(slice_).__name__}")
        self._fn = fn
        self._slice = slice_
        self._static = _argnums(static_argnums, f"{kind} static argnums")
        self._donate = _argnums(donate_argnums, f"{kind} donate_argnums")
        if self._static & self._donate:
            raise ValueError(f"{kind}: arguments {sorted(self._static & self._donate)} are both "
                             "static and donated")
        self._name = _name_of(fn, "fn")
        self._bound = {}  # (input tree, global specs, static values) -> (BoundFunction, out tree)
        self._op_programs = {}  # static values -> _Program

    def _split_static(self, args):
        static = tuple((i, a) for i, a in enumerate(args) if i in self._static)
        for i, a in static:
            try:
                hash(a)
            except TypeError:
                raise ValueError(f"{self._name}: static argument {i} must be hashable, got "
                                 f"{type(a).__name__}") from None
        missing = sorted(i for i in self._static if i >= len(args))
        if missing:
            raise ValueError(f"{self._name}: static argnums {missing} but only {len(args)} "
                             "positional arguments")
        return static, [a for i, a in enumerate(args) if i not in self._static]

    def _merge(self, static, dyn):
        args, it, fixed = [], iter(dyn), dict(static)
        for i in range(len(static) + len(dyn)):
            args.append(fixed[i] if i in fixed else next(it))
        return args

    def __call__(self, *args, timeout: float | None = None):
        import jax
        static, dyn = self._split_static(args)
        leaves, tree = jax.tree_util.tree_flatten(dyn)
        if any(isinstance(a, _pathways.Value) for a in leaves):
            if timeout is not None:
                raise ValueError(f"{self._name}: timeout= is for a call outside @pw.program; "
                                 "give it to the program's call")
            if not all(isinstance(a, _pathways.Value) for a in leaves):
                raise ValueError(f"{self._name}: inside @pw.program, every array argument must "
                                 "come from the program's arguments or another function's results "
                                 "(pass constants as program arguments, or make them static)")
            specs = tuple((a.spec[0], tuple(a.spec[1])) for a in leaves)
            key = (tree, specs, static)
            if key not in self._bound:
                self._bound[key] = self._bind(static, dyn, tree, specs)
            bound, out_tree = self._bound[key]
            return jax.tree_util.tree_unflatten(out_tree, bound(leaves))
        # Outside a program: its own one-node program (traced once per input specs).
        key = tuple((i, type(a), a) for i, a in static)
        if key not in self._op_programs:
            def op(*d, _static=static):
                return self(*self._merge(_static, d))
            op.__name__ = self._name
            dyn_positions = [i for i in range(len(args)) if i not in self._static]
            donate = [k for k, i in enumerate(dyn_positions) if i in self._donate]
            self._op_programs[key] = _Program(op, donate_argnums=donate, conn=self._slice._conn)
        return self._op_programs[key](*dyn, timeout=timeout)

    def _flat_fn(self, static, tree, out):
        """`fn` of flat leaves (static arguments closed over), its result flattened; the
        result's tree lands in out["tree"]."""
        import jax

        def flat_fn(*leaves):
            dyn = jax.tree_util.tree_unflatten(tree, leaves)
            result = self._fn(*self._merge(static, dyn))
            flat, out["tree"] = jax.tree_util.tree_flatten(result)
            return flat
        return flat_fn

    def _register(self, module, shard_ins, shard_outs, num_partitions, axis_size, in_layouts,
                  out_layouts):
        conn = self._slice._conn
        return conn.client.bind_stablehlo(self._name, module, shard_ins, shard_outs,
                                          self._slice._handle, num_partitions, axis_size,
                                          in_layouts, out_layouts)


class Pmapped(_Bound):
    """A JAX function mapped over a slice's devices, as jax.pmap maps it: each input split along
    its `in_axes` entry (one index per device; None: every device gets all of it), each result
    stacked along its `out_axes` entry (None: one value, the same on every device).

    Without an axis name each device's part is computed alone (one per-shard XLA computation).
    With one, the function may use collectives over that axis (jax.lax.psum, all_gather, ...),
    run by the runtime across worker processes (see _collectives.py). With a tuple of names, the
    slice's mesh axes (add_slice(mesh=(2, 2), axis_names=("data", "model"))), collectives may be
    over any of them: a psum over "model" meets within each model-parallel group. Devices are
    still one leading axis, in rank order (row-major over the mesh).
    """

    def __init__(self, fn, devices, axis_name=None, in_axes=0, out_axes=0,
                 static_broadcasted_argnums=(), donate_argnums=()):
        super().__init__(fn, devices, static_broadcasted_argnums, donate_argnums, "pmap")
        self._axis = axis_name
        self._in_axes = in_axes
        self._out_axes = out_axes

    def _dyn_in_axes(self, static, nargs):
        axes = self._in_axes
        if isinstance(axes, (tuple, list)) and static and len(axes) == nargs + len(static):
            fixed = dict(static)
            axes = tuple(a for i, a in enumerate(axes) if i not in fixed)
        return axes

    def _bind(self, static, dyn, tree, specs):
        n = self._slice.num_devices
        axes = _layout.leaf_axes(self._dyn_in_axes(static, len(dyn)), dyn, f"{self._name}: in_axes")
        shard_ins, in_layouts = [], []
        for k, ((dtype, shape), ax) in enumerate(zip(specs, axes)):
            if ax is None:
                shard_ins.append((dtype, list(shape)))
                in_layouts.append(_layout.replicated(dtype, shape, n))
                continue
            if not -len(shape) <= ax < len(shape):
                raise ValueError(f"{self._name}: in_axes {ax} for input {k} of shape "
                                 f"{tuple(shape)} is out of range (in_axes=None broadcasts an "
                                 "argument to every device)")
            ax %= len(shape)
            if shape[ax] != n:
                raise ValueError(f"{self._name}: input {k} has size {shape[ax]} along in_axes "
                                 f"{ax} (shape {tuple(shape)}), but the slice has {n} devices")
            shard_ins.append((dtype, list(shape[:ax]) + list(shape[ax + 1:])))
            in_layouts.append(_layout.split(dtype, shape, n, ax))
        module, shard_outs, out_tree = self._export(static, tree, shard_ins)
        out_axes = _layout.out_leaf_axes(self._out_axes, out_tree, f"{self._name}: out_axes")
        out_layouts = []
        for k, ((dtype, shape), ax) in enumerate(zip(shard_outs, out_axes)):
            if ax is None:
                out_layouts.append(_layout.replicated(dtype, shape, n))
                continue
            if not -len(shape) - 1 <= ax <= len(shape):
                raise ValueError(f"{self._name}: out_axes {ax} for output {k} of per-device "
                                 f"shape {tuple(shape)}: out of range")
            ax %= len(shape) + 1
            out_layouts.append(_layout.split(dtype, list(shape[:ax]) + [n] + list(shape[ax:]), n, ax))
        axis_size = 0 if self._axis is None else n
        bound = self._register(module, shard_ins, shard_outs, 1, axis_size, in_layouts, out_layouts)
        return bound, out_tree

    def _mesh(self):
        """The mesh the function is mapped over: (axis names, sizes). One axis of every device,
        or with a tuple of names, the slice's mesh (whose axis_names they must be)."""
        if isinstance(self._axis, (tuple, list)):
            axes = tuple(self._axis)
            if axes != self._slice.axis_names:
                raise ValueError(f"{self._name}: axis_name {axes} must be the slice's mesh axes "
                                 f"{self._slice.axis_names} (add_slice(mesh=..., axis_names=...))")
            return axes, tuple(self._slice.mesh_shape)
        return (self._axis,), (self._slice.num_devices,)

    def _export(self, static, tree, shard_specs):
        """One device's computation as a StableHLO module of its per-device inputs."""
        import jax
        n = self._slice.num_devices
        out = {}
        flat_fn = self._flat_fn(static, tree, out)
        avals = [jax.ShapeDtypeStruct(tuple(s), _layout.np_dtype(d)) for d, s in shard_specs]
        with jax.enable_x64(any(d in _layout.WIDE for d, _ in shard_specs)):
            if self._axis is None:
                # keep_unused: the module takes every argument the runtime passes, used or not.
                exported = jax.export.export(jax.jit(flat_fn, keep_unused=True))(*avals)
            else:
                from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P
                axes, shape = self._mesh()
                mesh = AbstractMesh(shape, axes)
                rows = P(axes)  # The leading axis over every mesh axis: row i on rank i.

                def per_device(*blocks):  # Partition i holds row i: pmap's view of it.
                    return [y[None] for y in flat_fn(*(b[0] for b in blocks))]

                # check_vma=False: pmap's typing (no varying/invariant distinction).
                mapped = jax.shard_map(per_device, mesh=mesh, in_specs=rows, out_specs=rows,
                                       check_vma=False)
                stacked = [jax.ShapeDtypeStruct((n, *a.shape), a.dtype,
                                                sharding=NamedSharding(mesh, rows))
                           for a in avals]
                # One shard's body, its collectives made the runtime's (see _collectives.py),
                # exported as a single-device module that runs in any worker process.
                body = _collectives.shard_map_body(jax.make_jaxpr(jax.jit(mapped))(*stacked))
                shard = _collectives.per_shard_function(body, axes, shape)

                def per_shard(*xs):
                    return [y[0] for y in shard(*(x[None] for x in xs))]

                exported = jax.export.export(
                    jax.jit(per_shard, keep_unused=True),
                    disabled_checks=_collectives.export_checks())(*avals)
        outs = [_layout.spec(a.shape, a.dtype) for a in exported.out_avals]
        return exported.mlir_module_serialized, outs, out["tree"]


class Jitted(_Bound):
    """A JAX function of global arrays compiled for a slice's mesh, as jax.jit with shardings:
    each input and result laid out by a PartitionSpec over the slice's mesh axes
    (add_slice(mesh=..., axis_names=...)). XLA's SPMD partitioner splits the computation and
    inserts its collectives, which meet inside one host's PJRT client: a slice of more than one
    device must lie on one host (placement='host'), embedded or on a process cluster. Functions
    that must span hosts use pw.pmap with axis_name=.
    """

    def __init__(self, fn, devices, in_shardings=None, out_shardings=None, static_argnums=(),
                 donate_argnums=()):
        super().__init__(fn, devices, static_argnums, donate_argnums, "jit")
        self._in_shardings = in_shardings
        self._out_shardings = out_shardings

    def _pspecs(self, shardings, tree_of, what):
        """One PartitionSpec per leaf of `tree_of` from a prefix of PartitionSpecs or
        NamedShardings (None: replicated)."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec
        names = self._slice.axis_names

        def one(s):
            if s is None:
                return PartitionSpec()
            if isinstance(s, NamedSharding):
                if tuple(s.mesh.axis_names) != names or tuple(s.mesh.axis_sizes) != self._slice.mesh_shape:
                    raise ValueError(f"{what}: {s} is over a mesh of axes "
                                     f"{dict(zip(s.mesh.axis_names, s.mesh.axis_sizes))}, not the "
                                     f"slice's {dict(zip(names, self._slice.mesh_shape))}")
                return s.spec
            if isinstance(s, PartitionSpec):
                return s
            raise TypeError(f"{what}: expected a PartitionSpec or NamedSharding, got {s!r}")

        is_spec = lambda x: isinstance(x, (PartitionSpec, NamedSharding))  # noqa: E731
        if shardings is None or is_spec(shardings):
            return [one(shardings)] * len(jax.tree_util.tree_leaves(tree_of))
        return [one(s) for s in _layout.prefix_leaves(shardings, tree_of, what, is_leaf=is_spec)]

    def _bind(self, static, dyn, tree, specs):
        import jax
        from jax.sharding import AbstractMesh, NamedSharding
        n, mesh_shape, names = self._slice.num_devices, self._slice.mesh_shape, self._slice.axis_names
        mesh = AbstractMesh(tuple(mesh_shape), tuple(names))
        in_shardings = self._in_shardings
        if isinstance(in_shardings, (tuple, list)) and static and len(in_shardings) == len(dyn) + len(static):
            in_shardings = tuple(s for i, s in enumerate(in_shardings) if i not in dict(static))
        if isinstance(in_shardings, list):
            in_shardings = tuple(in_shardings)
        pspecs = self._pspecs(in_shardings, tuple(dyn), f"{self._name}: in_shardings")
        in_layouts, avals = [], []
        for k, ((dtype, shape), ps) in enumerate(zip(specs, pspecs)):
            d2a = _layout.dim_to_axis(ps, len(shape), names, f"{self._name}: input {k}")
            in_layouts.append((dtype, list(shape), list(mesh_shape), d2a))
            avals.append(jax.ShapeDtypeStruct(tuple(shape), _layout.np_dtype(dtype),
                                              sharding=NamedSharding(mesh, ps)))
        # The result's tree, to lay out its leaves, from a first trace.
        out = {}
        flat_fn = self._flat_fn(static, tree, out)
        wide = any(d in _layout.WIDE for d, _ in specs)
        with jax.enable_x64(wide):
            jax.eval_shape(flat_fn, *avals)
        out_tree = out["tree"]
        dummy = jax.tree_util.tree_unflatten(out_tree, [0] * out_tree.num_leaves)
        out_pspecs = self._pspecs(self._out_shardings, dummy, f"{self._name}: out_shardings")
        with jax.enable_x64(wide):
            exported = jax.export.export(jax.jit(
                flat_fn, out_shardings=[NamedSharding(mesh, ps) for ps in out_pspecs],
                keep_unused=True))(*avals)
        out_layouts = []
        for k, (a, ps) in enumerate(zip(exported.out_avals, out_pspecs)):
            dtype = _layout.checked_dtype(a.dtype)
            d2a = _layout.dim_to_axis(ps, len(a.shape), names, f"{self._name}: output {k}")
            out_layouts.append((dtype, list(a.shape), list(mesh_shape), d2a))
        shard_ins = [(l[0], _layout.shard_shape(l)) for l in in_layouts]
        shard_outs = [(l[0], _layout.shard_shape(l)) for l in out_layouts]
        bound = self._register(exported.mlir_module_serialized, shard_ins, shard_outs,
                               n if n > 1 else 1, 0, in_layouts, out_layouts)
        return bound, out_tree


class _Program:
    """A traced program; it runs on the client of its first Array argument, else on `conn`'s
    (the client of the slice a pw.pmap/pw.jit function's own op program is bound to), else on
    this process's default client."""

    def __init__(self, fn, donate_argnums=(), conn=None):
        self._fn = fn
        self._conn = conn
        self._programs = {}
        self._name = _name_of(fn, "program")
        self._donate = _argnums(donate_argnums, "program donate_argnums")

    @staticmethod
    def _leaves(args):
        import jax
        from ._array import Array
        leaves, tree = jax.tree_util.tree_flatten(args)
        return [a if isinstance(a, Array) else _layout.host_array(a) for a in leaves], tree

    def _trace(self, leaves, tree):
        import jax
        from . import _default_connection
        from ._array import Array
        specs = [(a._live().spec[0], list(a.shape)) if isinstance(a, Array)
                 else _layout.spec(a.shape, a.dtype) for a in leaves]
        conn = next((a._conn for a in leaves if isinstance(a, Array)), None) or self._conn \
            or _default_connection()
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
        from ._array import Array
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        leaves, tree = self._leaves(args)
        prog, out_tree, conn = self._trace(leaves, tree)
        handles = [a._live() if isinstance(a, Array) else prog.put_arg(i, *_layout.raw(a))
                   for i, a in enumerate(leaves)]
        outs = [Array(h, conn) for h in prog.run(handles, timeout or 0.0)]
        for i in self._donate:  # Donated: deleted now (the run already holds their buffers).
            if i < len(args):
                for a in jax.tree_util.tree_leaves(args[i]):
                    if isinstance(a, Array):
                        a.delete()
        return jax.tree_util.tree_unflatten(out_tree, outs)
