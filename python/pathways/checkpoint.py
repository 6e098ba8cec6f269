"""pw.checkpoint: checkpoints of pytrees of pw.Arrays, written and read by the workers.

The on-disk layout is Orbax's without OCDBT (`use_ocdbt=False, use_zarr3=False`), so stock
`orbax-checkpoint` and `tensorstore` read what this writes, and `restore` reads what stock Orbax
wrote: a directory per checkpoint holding `_METADATA` (the tree), `_sharding` (stock Orbax
restoring without arguments puts each array on its process's cpu:0, when JAX there has the CPU
among its local devices), `_CHECKPOINT_METADATA`,
`commit_success.txt`, and per leaf a zarr v2 array named by its key path joined with "."
(`params.w`): `.zarray` and one chunk file per distinct shard, which the worker holding the shard
writes (one replica of a replicated one). Nothing goes through the client or the controller but
metadata; the commit is atomic (written under a temporary name, then renamed by the controller).

Paths: on a `pw up` cluster, relative to its checkpoint root (`pw up --checkpoint-root`, default
<state dir>/checkpoints) or absolute within it; on an embedded cluster, any path (relative to the
working directory).
"""
from __future__ import annotations

import base64
import json
import os
import secrets
import threading
import time

import jax
import numpy as np

from . import _layout
from ._array import Array

__all__ = ["save", "restore", "Save"]

_ORBAX_HANDLER = "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler"
# The checkpoint's own files, which no leaf may be named.
_RESERVED = {"_METADATA", "_CHECKPOINT_METADATA", "_sharding", "commit_success.txt"}
_last_save: Save | None = None
_last_lock = threading.Lock()


def _key_name(k) -> tuple[str, int]:
    """A key path entry's name and Orbax's key type (1: sequence, 2: dict)."""
    if isinstance(k, jax.tree_util.SequenceKey):
        return str(k.idx), 1
    if isinstance(k, jax.tree_util.FlattenedIndexKey):
        return str(k.key), 1
    if isinstance(k, jax.tree_util.DictKey):
        return str(k.key), 2
    if isinstance(k, jax.tree_util.GetAttrKey):
        return k.name, 2
    raise TypeError(f"pw.checkpoint: a key of type {type(k).__name__} ({k})")


def _leaves(tree, what: str):
    """[(names, key types, leaf)] in tree order, and the tree's structure. Leaves are pw.Arrays
    or host values (numpy arrays, numpy and Python scalars); at least one is a pw.Array."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    out = []
    for path, leaf in flat:
        keys = [_key_name(k) for k in path]
        names = tuple(n for n, _ in keys)
        if not isinstance(leaf, Array):
            try:
                _layout.host_array(leaf)
            except (TypeError, ValueError) as e:
                raise TypeError(f"pw.checkpoint.{what}: leaf {'.'.join(names) or '(root)'} is a "
                                f"{type(leaf).__name__}, neither a pw.Array nor an array of a "
                                f"supported dtype ({e})") from None
        if any("/" in n or n in ("", ".", "..") for n in names):
            raise ValueError(f"pw.checkpoint.{what}: key path {names} cannot name a directory")
        out.append((names, [t for _, t in keys], leaf))
    seen = {}
    for names, _, _ in out:
        name = ".".join(names)
        if name in _RESERVED:
            raise ValueError(f"pw.checkpoint.{what}: a leaf named {name} would overwrite the "
                             "checkpoint's own file of that name")
        if name in seen:
            raise ValueError(f"pw.checkpoint.{what}: key paths {seen[name]} and {names} both "
                             f"name the directory {name}")
        seen[name] = names
    arrays = [leaf for _, _, leaf in out if isinstance(leaf, Array)]
    if not arrays:
        raise ValueError(f"pw.checkpoint.{what}: the tree has no pw.Array (its host values go on "
                         "the slice of its first pw.Array)")
    return out, treedef, arrays[0]


def _home(first: Array):
    """The slice handle of `first`'s slice, where a tree's host values are put."""
    h = first._live()
    handle, _ = first._conn.slices.get(h.slice_id, (None, None))
    if handle is None:
        raise ValueError("pw.checkpoint: the tree's first pw.Array is not on a slice of this "
                         "client's (an imported array?)")
    return handle


def _resolve(path: str, conn) -> str:
    """A path the cluster takes: on an embedded cluster, relative to the working directory."""
    from . import _pathways
    path = os.fspath(path)
    if isinstance(conn.cluster, _pathways.EmbeddedCluster):
        return os.path.abspath(path)
    return path.rstrip("/")


def _metadata(leaves) -> dict:
    tree = {}
    for names, types, leaf, host in leaves:
        shard = leaf.sharding.shard_shape(leaf.shape)
        tree[str(names)] = {
            "key_metadata": [{"key": n, "key_type": t} for n, t in zip(names, types)],
            "value_metadata": {"value_type": "np.ndarray" if host else "jax.Array",
                               "skip_deserialize": False, "write_shape": list(shard)},
        }
    return {"tree_metadata": tree, "use_ocdbt": False, "use_zarr3": False,
            "store_array_data_equal_to_fill_value": True, "custom_metadata": None}


def _shardings(leaves) -> dict:
    """Orbax's `_sharding` file: where a stock Orbax restore without arguments puts each array
    (the reading process's device cpu:0; its restore_args can say otherwise)."""
    one = json.dumps({"sharding_type": "SingleDeviceSharding", "device_str": "cpu:0"})
    return {base64.urlsafe_b64encode(".".join(names).encode()).decode(): one
            for names, _, _, host in leaves if not host}


class Save:
    """A checkpoint being written: `wait()` returns its absolute path once committed (raising
    the first error: a shard that could not be written, a commit refused), `done()` says
    whether it has ended. Training goes on meanwhile; the arrays are held until written."""

    def __init__(self, leaves, conn, path: str, after: Save | None):
        self._error = None
        self._path = None
        self._done = threading.Event()
        started = time.time_ns()
        # Written under a name of its own, renamed when whole: a reader never sees part of it.
        tmp = f"{path}.orbax-checkpoint-tmp-{secrets.token_hex(4)}"
        # Every shard's write starts now (the arrays' runs go first, in the workers' order).
        writes = [leaf._live().save(f"{tmp}/{'.'.join(names)}") for names, _, leaf, _ in leaves]
        files = [("_METADATA", json.dumps(_metadata(leaves)).encode()),
                 ("_sharding", json.dumps(_shardings(leaves)).encode())]

        def commit():
            try:
                if after is not None:
                    after._done.wait()
                for w in writes:
                    w.wait()
                files.append(("_CHECKPOINT_METADATA", json.dumps({
                    "item_handlers": _ORBAX_HANDLER, "metrics": {}, "performance_metrics": {},
                    "init_timestamp_nsecs": started, "commit_timestamp_nsecs": time.time_ns(),
                    "custom_metadata": {}}).encode()))
                files.append(("commit_success.txt",
                              f"Checkpoint commit was successful to {path}".encode()))
                self._path = conn.client.commit_checkpoint(tmp, files, path)
            except BaseException as e:  # Raised by wait().
                self._error = e
            finally:
                self._done.set()

        threading.Thread(target=commit, name="pw-checkpoint", daemon=True).start()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> str:
        if not self._done.wait(timeout):
            raise TimeoutError("pw.checkpoint: the save has not finished")
        if self._error is not None:
            raise self._error
        return self._path


def save(tree, path: str) -> Save:
    """Writes a pytree as a checkpoint at `path`, asynchronously: returns a `Save` at once (the
    workers write each array once computed; `wait()` for the committed path). Leaves are
    pw.Arrays, or host values (numpy arrays, scalars: put on the slice of the tree's first
    pw.Array, replicated, and written from there). A second save's commit comes after the
    first's. A checkpoint already at `path` is an error."""
    global _last_save
    leaves, _, first = _leaves(tree, "save")
    conn = first._conn
    if any(isinstance(leaf, Array) and leaf._conn is not conn for _, _, leaf in leaves):
        raise ValueError("pw.checkpoint.save: the arrays belong to different clients")
    home = _home(first) if any(not isinstance(leaf, Array) for _, _, leaf in leaves) else None
    placed = []  # (names, key types, pw.Array, whether a host value)
    for names, types, leaf in leaves:
        if isinstance(leaf, Array):
            placed.append((names, types, leaf, False))
            continue
        x = _layout.host_array(leaf)
        array = Array(conn.client.put(home, *_layout.raw(x), list(home.mesh_shape),
                                      [-1] * x.ndim), conn)
        placed.append((names, types, array, True))
    with _last_lock:
        s = Save(placed, conn, _resolve(path, conn), _last_save)
        _last_save = s
    return s


def restore(path: str, like, *, devices=None, sharding=None):
    """Reads the checkpoint at `path` into values laid out as `like` says: a pytree of the
    checkpoint's structure whose leaves are pw.Arrays (each restored onto its leaf's slice and
    sharding, so a checkpoint of one sharding restores onto another) or host values (numpy
    arrays, scalars: read through the slice of the tree's first pw.Array and returned as the same
    type); or, with `devices` (a Slice), leaves that are anything with .shape and .dtype (numpy
    arrays, jax.ShapeDtypeStruct, the arrays of a slice that was lost), each restored as a
    pw.Array on `devices` laid out by `sharding` (a PartitionSpec over the slice's mesh axes;
    default: replicated). The workers read their shards; pw.Arrays come back at once, ready once
    read. Reads stock Orbax checkpoints too (zarr v2, raw or zstd chunks)."""
    if devices is None:
        leaves, treedef, first = _leaves(like, "restore")
        conn = first._conn
    else:
        flat, treedef = jax.tree_util.tree_flatten_with_path(like)
        leaves = [(tuple(_key_name(k)[0] for k in p), None, leaf) for p, leaf in flat]
        conn = devices._conn
    root = _resolve(path, conn)
    out = []
    for names, _, leaf in leaves:
        where = f"{root}/{'.'.join(names)}"
        if devices is not None:
            shape = tuple(int(d) for d in leaf.shape)
            dtype = _layout.checked_dtype(leaf.dtype)
            mesh = list(devices.mesh_shape)
            d2a = _layout.dim_to_axis(sharding if sharding is not None else
                                      jax.sharding.PartitionSpec(), len(shape),
                                      devices.axis_names, "pw.checkpoint.restore")
            out.append(Array(conn.client.load(devices._handle, dtype, list(shape), mesh, d2a,
                                              where), conn))
        elif not isinstance(leaf, Array):
            x = _layout.host_array(leaf)
            home = _home(first)
            read = Array(conn.client.load(home, _layout.checked_dtype(x.dtype), list(x.shape),
                                          list(home.mesh_shape), [-1] * x.ndim, where), conn)
            value = np.asarray(read)
            out.append(value if isinstance(leaf, np.ndarray) else type(leaf)(value.item())
                       if isinstance(leaf, (bool, int, float, complex)) else value[()])
        else:
            h = leaf._live()
            handle, _ = conn.slices.get(h.slice_id, (None, None))
            if handle is None or leaf._conn is not conn:
                raise ValueError(f"pw.checkpoint.restore: leaf {'.'.join(names)} is not on a "
                                 "slice of this client's (pass devices= to restore onto a slice)")
            mesh, d2a = h.sharding
            dtype, shape = h.spec
            out.append(Array(conn.client.load(handle, dtype, list(shape), list(mesh), list(d2a),
                                              where), conn))
    return jax.tree_util.tree_unflatten(treedef, out)
