"""Dtypes, shapes and layouts as the runtime takes them.

A layout is `(dtype, global shape, mesh shape, dim_to_axis)`: a global array sharded over a
slice's devices arranged as `mesh shape` (row-major over the slice's device list), dimension d
split along mesh axis `dim_to_axis[d]` (-1: whole). Mesh axes that split no dimension replicate
it (pw::Sharding in pw/base/sharding.h).
"""
from __future__ import annotations

import numpy as np

# numpy's dtype name -> the runtime's. bfloat16 is ml_dtypes' (JAX's) numpy type.
DTYPES = {"float32": "f32", "float64": "f64", "int32": "s32", "int64": "s64", "bool": "pred",
          "uint8": "u8", "int8": "s8", "float16": "f16", "uint32": "u32", "bfloat16": "bf16",
          "int16": "s16", "uint16": "u16", "uint64": "u64", "complex64": "c64"}
WIDE = ("f64", "s64", "u64")  # Dtypes that need JAX's x64 mode to export.


def checked_dtype(dtype) -> str:
    """The runtime's name of a numpy dtype, or a TypeError naming it and what is supported."""
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise TypeError(f"dtype {name} is not supported by pathways; supported: "
                        f"{', '.join(sorted(DTYPES))}")
    return DTYPES[name]


def np_dtype(name: str):
    if name == "bf16":
        import ml_dtypes  # JAX's numpy dtypes (a dependency of jax).
        return np.dtype(ml_dtypes.bfloat16)
    for k, v in DTYPES.items():
        if v == name:
            return np.dtype(k)
    raise ValueError(f"unknown dtype {name}")


def spec(shape, dtype):
    return (checked_dtype(dtype), list(shape))


def raw(x):
    """What the extension takes for a host array: its bytes (a flat uint8 view: any dtype,
    read-only or not), the runtime's dtype name and the shape. `x` must be C-contiguous."""
    return x.reshape(-1).view(np.uint8), checked_dtype(x.dtype), list(x.shape)


# Python scalars take JAX's default dtypes (x64 off), not numpy's 64-bit ones.
_PY_SCALARS = {bool: np.bool_, int: np.int32, float: np.float32, complex: np.complex64}


def host_array(x):
    """Any array-like (numpy, jax.Array, Python scalar, read-only or strided) as a C-contiguous
    numpy array of a supported dtype."""
    if type(x) in _PY_SCALARS:
        x = np.asarray(x, _PY_SCALARS[type(x)])
    x = np.asarray(x)
    if not x.flags.c_contiguous:  # (np.ascontiguousarray alone would make a 0-d array 1-d.)
        x = np.ascontiguousarray(x)
    checked_dtype(x.dtype)
    return x


def replicated(dtype: str, shape, n: int):
    return (dtype, list(shape), [n], [-1] * len(shape))


def split(dtype: str, shape, n: int, dim: int):
    d2a = [-1] * len(shape)
    d2a[dim] = 0
    return (dtype, list(shape), [n], d2a)


def shard_shape(layout):
    _, shape, mesh, d2a = layout
    return [s // mesh[a] if a >= 0 else s for s, a in zip(shape, d2a)]


def dim_to_axis(pspec, rank: int, axis_names, where: str):
    """A jax.sharding.PartitionSpec over a mesh with `axis_names` as the runtime's dim_to_axis.
    Each dimension is split along at most one mesh axis."""
    entries = tuple(pspec) if pspec is not None else ()
    if len(entries) > rank:
        raise ValueError(f"{where}: PartitionSpec {pspec} has {len(entries)} entries but the "
                         f"array has rank {rank}")
    out = []
    for d, e in enumerate(entries + (None,) * (rank - len(entries))):
        if isinstance(e, (tuple, list)):
            if len(e) > 1:
                raise ValueError(f"{where}: dimension {d} is split over mesh axes {tuple(e)}; "
                                 "pathways splits a dimension along at most one mesh axis")
            e = e[0] if e else None
        if e is None:
            out.append(-1)
        elif isinstance(e, str) and e in axis_names:
            out.append(list(axis_names).index(e))
        else:
            raise ValueError(f"{where}: PartitionSpec {pspec} names {e!r}, not an axis of the "
                             f"slice's mesh {tuple(axis_names)}")
    return out


def partition_spec(d2a, axis_names):
    """The PartitionSpec of a runtime dim_to_axis over a mesh with `axis_names`."""
    from jax.sharding import PartitionSpec
    entries = [axis_names[a] if a >= 0 else None for a in d2a]
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def leaf_axes(axes, args, what: str):
    """pmap's in_axes (an int, None, or one entry per positional argument, each a pytree prefix
    of its argument) as one axis per leaf of `args`, in tree_flatten order."""
    import jax
    if axes is None or isinstance(axes, int):
        return [axes] * len(jax.tree_util.tree_leaves(args))
    axes = tuple(axes) if isinstance(axes, list) else axes
    if not isinstance(axes, tuple) or len(axes) != len(args):
        raise ValueError(f"{what} must be an int, None or a tuple of one entry per positional "
                         f"argument ({len(args)}), got {axes!r}")
    out = []
    for a, arg in zip(axes, args):
        out.extend(prefix_leaves(a, arg, what))
    return out


class _Sub:  # One prefix leaf's subtree (not a pytree node, so tree_leaves stops at it).
    __slots__ = ("axis", "tree")

    def __init__(self, axis, tree):
        self.axis, self.tree = axis, tree


def prefix_leaves(prefix, tree, what: str, is_leaf=None):
    """One entry per leaf of `tree`, from `prefix`: a pytree prefix of it whose leaves (None, or
    what `is_leaf` accepts) each stand for the whole subtree under them."""
    import jax
    leaf = lambda x: x is None or (is_leaf is not None and is_leaf(x))  # noqa: E731
    try:
        subs = jax.tree_util.tree_map(_Sub, prefix, tree, is_leaf=leaf)
    except ValueError as e:
        raise ValueError(f"{what} entry {prefix!r} is not a prefix of its argument: {e}") from None
    out = []
    for s in jax.tree_util.tree_leaves(subs):
        out.extend([s.axis] * len(jax.tree_util.tree_leaves(s.tree)))
    return out


def out_leaf_axes(axes, out_tree, what: str):
    """pmap's out_axes (an int, None, or a pytree prefix of the result) as one axis per leaf."""
    import jax
    if axes is None or isinstance(axes, int):
        return [axes] * out_tree.num_leaves
    dummy = jax.tree_util.tree_unflatten(out_tree, [0] * out_tree.num_leaves)
    return prefix_leaves(axes, dummy, what)
