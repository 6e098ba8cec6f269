"""Collectives of a pw.pmap function, run by the runtime instead of inside XLA.

A function mapped with an axis name is traced as JAX would trace it under shard_map; the body of
one shard is then re-traced by a small jaxpr interpreter that replaces every collective over the
axis (psum, pmean, pmax, pmin, all_gather, psum_scatter, all_to_all, ppermute, pbroadcast,
axis_index) by an XLA FFI custom call (`pw_all_reduce`, ...), and the result is exported as one
single-device module per shard. Each worker registers the handlers of those calls with its PJRT
plugin (pw/pjrt/runtime_collectives.h); they meet through the runtime's collectives, in the
island's gang order, across worker processes, and fail (instead of hanging) when a peer is lost.

The custom calls take flat, rank-major buffers; the layout work (moving axes, tiling, widening
16-bit floats for reductions) is done here in JAX, where XLA compiles it with the rest.

A function may be mapped over a mesh of several axes (pw.pmap with a tuple of axis names over a
slice's mesh, e.g. ("data", "model")): a collective over some of them meets in groups, the ranks
that differ only along those axes (`meeting`), which every call names in its `groups` and
`group_size` attributes, so a psum over "model" reduces within each model-parallel group and one
over "data" across them.

Not supported (a clear error at bind time): collectives over other axes than the ones mapped,
axis_index_groups, nested shard_map/pmap, and collectives whose primitive this module does not
know (listed in the error).
"""
from __future__ import annotations

import numpy as np

_SUM, _MAX, _MIN = 0, 1, 2
_REDUCTIONS = {"psum": _SUM, "psum_invariant": _SUM, "psum2": _SUM, "pmax": _MAX, "pmin": _MIN}
_IDENTITY = {"pvary", "core_pvary"}
_GATHERS = {"all_gather", "all_gather_invariant"}
_OTHERS = {"reduce_scatter", "all_to_all", "ppermute", "axis_index", "pbroadcast"}
# Primitives whose sub-jaxprs are inlined: calls (their body runs once, here).
_INLINED = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
            "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
            "custom_vjp_call_jaxpr": "fun_jaxpr", "remat": "jaxpr", "checkpoint": "jaxpr",
            "remat2": "jaxpr"}


# The custom-call targets, registered by every worker (pw/pjrt/runtime_collectives.cc).
TARGETS = ("pw_all_reduce", "pw_all_gather", "pw_reduce_scatter", "pw_all_to_all", "pw_ppermute",
           "pw_axis_index", "pw_after")


class UnsupportedCollective(ValueError):
    pass


def export_checks():
    """jax.export's safety checks to skip: our custom calls are served by our own workers."""
    import jax
    return [jax.export.DisabledSafetyCheck.custom_call(t) for t in TARGETS]


def per_shard_function(body_jaxpr, axes, shape):
    """A function of one shard's blocks that evaluates `body_jaxpr` (a shard_map body over a
    mesh of `axes` (names) with sizes `shape`, ranks row-major) with runtime collectives."""
    interp = _Interpreter(tuple(axes), tuple(int(k) for k in shape))

    if body_jaxpr.constvars:
        raise UnsupportedCollective("a shard_map body with constants is not supported")

    def run(*blocks):
        return interp.eval(body_jaxpr, (), blocks)

    return run


def shard_map_body(closed_jaxpr):
    """The body jaxpr of the (only) shard_map inside `closed_jaxpr`."""
    for eqn in closed_jaxpr.jaxpr.eqns:
        if eqn.primitive.name == "shard_map":
            return eqn.params["jaxpr"]
        for sub in _sub_jaxprs(eqn.params):
            try:
                return shard_map_body(sub if hasattr(sub, "consts") else _Closed(sub))
            except LookupError:
                pass
    raise LookupError("no shard_map in the traced function")


class _Closed:  # An open jaxpr seen as a closed one with no constants.
    def __init__(self, jaxpr):
        self.jaxpr, self.consts = jaxpr, ()


def _sub_jaxprs(params):
    from jax.extend import core as jcore
    for v in params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(x, (jcore.ClosedJaxpr, jcore.Jaxpr)):
                yield x


def meeting(mesh_axes, mesh_shape, axes):
    """Which ranks of a mesh meet in a collective over `axes` (a subset of `mesh_axes`, in the
    order that numbers a group's ranks, as JAX's axis_index over a tuple of axes does): every
    rank once, group after group (groups ordered by the other axes, row-major), and the size of
    a group. Over every axis in mesh order this is 0..n-1 and n."""
    grid = np.arange(int(np.prod(mesh_shape, dtype=np.int64))).reshape(mesh_shape)
    inside = [mesh_axes.index(a) for a in axes]
    outside = [i for i in range(len(mesh_axes)) if i not in inside]
    size = int(np.prod([mesh_shape[i] for i in inside], dtype=np.int64))
    return grid.transpose(outside + inside).reshape(-1).astype(np.int64), size


class _Interpreter:
    def __init__(self, axes, shape):
        self.axes, self.shape = axes, shape
        self.next_op = 0
        self.groups, self.group_size = None, 0  # The collective being rewritten's (meeting).
        # The last collective's output in the trace being built: the next one takes it as its
        # `after` operand, so every shard runs the collectives in the trace's order (XLA runs
        # independent side-effecting calls in any order; shards in different rendezvous would
        # wait for each other forever).
        self.last = None

    # ---- evaluation

    def eval(self, jaxpr, consts, args):
        from jax.extend import core as jcore
        env = {}

        def read(v):
            return v.val if isinstance(v, jcore.Literal) else env[v]

        for v, c in zip(jaxpr.constvars, consts):
            env[v] = c
        for v, a in zip(jaxpr.invars, args):
            env[v] = a
        for eqn in jaxpr.eqns:
            outs = self.apply(eqn, [read(v) for v in eqn.invars])
            if not eqn.primitive.multiple_results:
                outs = [outs]
            for v, o in zip(eqn.outvars, outs):
                if not isinstance(v, jcore.DropVar):
                    env[v] = o
        return [read(v) for v in jaxpr.outvars]

    def apply(self, eqn, args):
        name, params = eqn.primitive.name, eqn.params
        if name in _IDENTITY:
            return list(args) if eqn.primitive.multiple_results else args[0]
        if name in _REDUCTIONS or name in _GATHERS or name in _OTHERS:
            axes = self._axes_of(name, params)
            if name == "ppermute":  # JAX numbers ppermute's ranks in mesh order, not the tuple's.
                axes = tuple(sorted(axes, key=self.axes.index))
            # Whom this collective meets (see meeting): what its calls name.
            self.groups, self.group_size = meeting(self.axes, self.shape, axes)
            if name in _REDUCTIONS and len(args) > 1:  # A pytree's leaves, reduced together.
                outs = self._all_reduce_many(args, _REDUCTIONS[name])
            else:
                outs = [self._collective(name, params, x) for x in (args or [None])]
            return outs if eqn.primitive.multiple_results else outs[0]
        if name == "shard_map" or name == "xla_pmap":
            raise UnsupportedCollective(f"a nested {name} inside a pw.pmap function is not supported")
        if name in _INLINED:
            sub = params.get(_INLINED[name])
            if sub is None:
                sub = next(iter(_sub_jaxprs(params)), None)
            if sub is not None:
                jaxpr, consts = (sub.jaxpr, sub.consts) if hasattr(sub, "consts") else (sub, ())
                outs = self.eval(jaxpr, consts, args)
                return outs if eqn.primitive.multiple_results else outs[0]
        subs = list(_sub_jaxprs(params))
        if subs:  # while, cond, scan, ...: the same primitive over rewritten sub-jaxprs.
            ops_before = self.next_op
            rewritten = self._rewrite_params(params)
            if self.next_op == ops_before:
                return eqn.primitive.bind(*args, **rewritten)
            # It holds collectives: it starts after those before it, and those after it follow.
            args = self._ordered_after_last(args)
            outs = eqn.primitive.bind(*args, **rewritten)
            results = outs if eqn.primitive.multiple_results else [outs]
            if results:
                self.last = results[0]
            return outs
        return eqn.primitive.bind(*args, **params)

    def _ordered_after_last(self, args):
        """`args` with its first array taken through pw_after the last collective (if any)."""
        import jax
        if self.last is None:
            return args
        args = list(args)
        for i, a in enumerate(args):
            if isinstance(a, jax.Array):  # A traced value (not a literal).
                out = jax.ShapeDtypeStruct(a.shape, a.dtype)
                args[i] = jax.ffi.ffi_call("pw_after", out, has_side_effect=True)(a, self.last)
                break
        return args

    def _rewrite_params(self, params):
        from jax.extend import core as jcore
        out = {}
        for k, v in params.items():
            if isinstance(v, (tuple, list)) and any(isinstance(x, (jcore.ClosedJaxpr, jcore.Jaxpr)) for x in v):
                out[k] = type(v)(self._retrace(x) for x in v)
            elif isinstance(v, (jcore.ClosedJaxpr, jcore.Jaxpr)):
                out[k] = self._retrace(v)
            else:
                out[k] = v
        return out

    def _retrace(self, sub):
        import jax
        from jax.extend import core as jcore
        closed = isinstance(sub, jcore.ClosedJaxpr)
        jaxpr, consts = (sub.jaxpr, sub.consts) if closed else (sub, ())
        avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.invars]
        outer, self.last = self.last, None  # A chain of its own inside (its tracers stay there).
        try:
            new = jax.make_jaxpr(lambda *a: self.eval(jaxpr, consts, a))(*avals)
        finally:
            self.last = outer
        if closed:
            return new
        if new.consts:
            raise UnsupportedCollective("a loop body with constants captured from collectives")
        return new.jaxpr

    # ---- collectives

    def _axes_of(self, name, params):
        """The mesh axes a collective is over, in its order; UnsupportedCollective if not ours."""
        axes = params.get("axes", params.get("axis_name"))
        axes = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
        if not axes or len(set(axes)) != len(axes) or any(a not in self.axes for a in axes):
            raise UnsupportedCollective(
                f"{name} over axes {axes}: a pw.pmap function's collectives must be over its "
                f"axes {self.axes}, each at most once")
        if params.get("axis_index_groups") is not None:
            raise UnsupportedCollective(f"{name} with axis_index_groups is not supported")
        return axes

    def _op_id(self):
        k = self.next_op
        self.next_op += 1
        return np.int64(k)

    def _call(self, target, out_shape, dtype, *args, **attrs):
        import jax
        import jax.numpy as jnp
        attrs["groups"], attrs["group_size"] = self.groups, np.int64(self.group_size)
        out = jax.ShapeDtypeStruct(tuple(out_shape), dtype)
        if target == "pw_axis_index":  # No rendezvous: nothing to order.
            return jax.ffi.ffi_call(target, out, has_side_effect=True)(*args, **attrs)
        after = self.last if self.last is not None else jnp.zeros((0,), jnp.int8)
        y = jax.ffi.ffi_call(target, out, has_side_effect=True)(*args, after, **attrs)
        self.last = y
        return y

    def _collective(self, name, params, x):
        """One collective among the group_size ranks of each of the groups."""
        import jax.numpy as jnp
        n = self.group_size
        if name == "axis_index":
            return self._call("pw_axis_index", (), np.int32)
        if name in _REDUCTIONS:
            return self._all_reduce(x, _REDUCTIONS[name])
        if name in _GATHERS:
            d, tiled = params["all_gather_dimension"], params["tiled"]
            g = self._call("pw_all_gather", (n, *x.shape), x.dtype, x, op_id=self._op_id())
            g = jnp.moveaxis(g, 0, d)
            if tiled:
                g = g.reshape(x.shape[:d] + (n * x.shape[d],) + x.shape[d + 1:])
            return g
        if name == "pbroadcast":
            g = self._call("pw_all_gather", (n, *x.shape), x.dtype, x, op_id=self._op_id())
            return g[params["source"]]
        if name == "reduce_scatter":
            d, tiled = params["scatter_dimension"], params["tiled"]
            xt = jnp.moveaxis(x, d, 0)
            rest = xt.shape[1:]
            piece = xt.shape[0] // n
            y = self._reduce_scatter(xt.reshape(n, -1), _SUM)
            y = jnp.moveaxis(y.reshape((piece,) + rest), 0, d)
            return y if tiled else jnp.squeeze(y, d)
        if name == "all_to_all":
            s, c = params["split_axis"], params["concat_axis"]
            xt = jnp.moveaxis(x, s, 0)
            piece_s = xt.shape[0] // n
            rest = xt.shape[1:]
            y = self._call("pw_all_to_all", (n, xt.size // n), x.dtype, xt.reshape(n, -1),
                           op_id=self._op_id())
            pieces = jnp.moveaxis(y.reshape((n, piece_s) + rest), 1, s + 1)  # (n, *piece)
            shape = pieces.shape[1:]
            out = jnp.moveaxis(pieces, 0, c)
            return out.reshape(shape[:c] + (n * shape[c],) + shape[c + 1:])
        if name == "ppermute":
            pairs = np.array([p for pair in params["perm"] for p in pair], dtype=np.int64)
            return self._call("pw_ppermute", x.shape, x.dtype, x, op_id=self._op_id(), pairs=pairs)
        raise UnsupportedCollective(f"collective {name} is not supported")

    @staticmethod
    def _widened(x):
        import jax.numpy as jnp
        return x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x

    def _all_reduce(self, x, reduction):
        w = self._widened(x)
        y = self._call("pw_all_reduce", w.shape, w.dtype, w, op_id=self._op_id(),
                       reduction=np.int64(reduction))
        return y.astype(x.dtype)

    def _all_reduce_many(self, xs, reduction):
        """One all-reduce per element type for many arrays (a psum of a pytree, e.g. every
        gradient of a model): flattened and joined, reduced in one rendezvous, split again.
        One message per peer process instead of one per array."""
        import jax.numpy as jnp
        widened = [self._widened(x) for x in xs]
        outs = [None] * len(xs)
        for dtype in dict.fromkeys(w.dtype for w in widened):
            which = [i for i, w in enumerate(widened) if w.dtype == dtype]
            joined = jnp.concatenate([widened[i].reshape(-1) for i in which])
            y = self._call("pw_all_reduce", joined.shape, dtype, joined, op_id=self._op_id(),
                           reduction=np.int64(reduction))
            start = 0
            for i in which:
                size = widened[i].size
                outs[i] = y[start:start + size].reshape(xs[i].shape).astype(xs[i].dtype)
                start += size
        return outs

    def _reduce_scatter(self, x2, reduction):
        w = self._widened(x2)
        y = self._call("pw_reduce_scatter", (w.shape[1],), w.dtype, w, op_id=self._op_id(),
                       reduction=np.int64(reduction))
        return y.astype(x2.dtype)
