"""Exports small JAX functions as StableHLO portable artifacts, for the PJRT backend's tests.

Usage: export_stablehlo.py OUT_DIR
Writes OUT_DIR/<name>.mlirbc (jax.export's serialized module) for each function below.
Per-shard functions are exported for one device; SPMD ones (collectives across the slice) as
one module of N partitions, pmap-style: shard i of every argument and result is row i; runtime
ones (rt_*) as pw.pmap exports them: one per-shard module whose collectives are the runtime's
(python/pathways/_collectives.py).
"""
import importlib.util
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

SCALAR = jax.ShapeDtypeStruct((), jnp.float32)

FUNCTIONS = {
    # name: (function, input shapes/dtypes)
    # The paper's Figure 2 functions, per shard (pmap maps one element to each device).
    "mul2": (lambda x: x * 2.0, [SCALAR]),
    "add1": (lambda x: x + 1.0, [SCALAR]),
    "div2": (lambda x: x / 2.0, [SCALAR]),
    "times_two": (lambda x: x * 2.0, [jax.ShapeDtypeStruct((2,), jnp.float32)]),
    "affine": (lambda x, w, b: jnp.tanh(x @ w + b),
               [jax.ShapeDtypeStruct((4, 3), jnp.float32),
                jax.ShapeDtypeStruct((3, 2), jnp.float32),
                jax.ShapeDtypeStruct((2,), jnp.float32)]),
    # Enough work (4 MFLOP) that XLA's CPU client does not count it as cheap.
    "tanh_matmul": (lambda x: jnp.tanh(x @ x), [jax.ShapeDtypeStruct((128, 128), jnp.float32)]),
}


VEC3 = jax.ShapeDtypeStruct((3,), jnp.float32)
SPMD_FUNCTIONS = {
    # name: (function of one shard, per-shard inputs, partitions)
    "psum2": (lambda x: jax.lax.psum(x * 2.0, "i"), [VEC3], 2),
    "psum4": (lambda x: jax.lax.psum(x * 2.0, "i"), [VEC3], 4),
    "allgather_sum4": (lambda x: x + jnp.sum(jax.lax.all_gather(x, "i")), [VEC3], 4),
    "psum2_i32": (lambda x: jax.lax.psum(x, "i"), [jax.ShapeDtypeStruct((3,), jnp.int32)], 2),
}


def export_spmd(fn, shard_args, n):
    from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P
    mesh = AbstractMesh((n,), ("i",))

    def per_device(*xs):  # Each device sees its row, as under pmap.
        return jax.tree.map(lambda y: y[None], fn(*(x[0] for x in xs)))

    mapped = jax.shard_map(per_device, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    args = [jax.ShapeDtypeStruct((n, *a.shape), a.dtype, sharding=NamedSharding(mesh, P("i")))
            for a in shard_args]
    return jax.export.export(jax.jit(mapped))(*args)


# name: (function of one shard, per-shard inputs, mesh {axis: size}): exported as pw.pmap does.
RUNTIME_FUNCTIONS = {
    "rt_psum2": (lambda x: jax.lax.psum(x * 2.0, "i"), [VEC3], {"i": 2}),
    "rt_psum4": (lambda x: jax.lax.psum(x * 2.0, "i"), [VEC3], {"i": 4}),
    "rt_allgather_sum4": (lambda x: x + jnp.sum(jax.lax.all_gather(x, "i")), [VEC3], {"i": 4}),
    # Over one axis of a 2 x 2 mesh: ranks {0, 1} and {2, 3} meet apart.
    "rt_psum_model4": (lambda x: jax.lax.psum(x * 2.0, "model"), [VEC3],
                       {"data": 2, "model": 2}),
}


def export_runtime(fn, shard_args, mesh_axes):
    here = pathlib.Path(__file__).resolve().parent.parent / "python" / "pathways" / "_collectives.py"
    spec = importlib.util.spec_from_file_location("pw_collectives", here)
    collectives = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(collectives)
    from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P
    axes, shape = tuple(mesh_axes), tuple(mesh_axes.values())
    n = int(np.prod(shape))
    mesh = AbstractMesh(shape, axes)

    def per_device(*xs):
        return jax.tree.map(lambda y: y[None], fn(*(x[0] for x in xs)))

    mapped = jax.shard_map(per_device, mesh=mesh, in_specs=P(axes), out_specs=P(axes),
                           check_vma=False)
    args = [jax.ShapeDtypeStruct((n, *a.shape), a.dtype, sharding=NamedSharding(mesh, P(axes)))
            for a in shard_args]
    body = collectives.shard_map_body(jax.make_jaxpr(jax.jit(mapped))(*args))
    shard = collectives.per_shard_function(body, axes, shape)

    def per_shard(*xs):
        return [y[0] for y in shard(*(x[None] for x in xs))]

    return jax.export.export(jax.jit(per_shard),
                             disabled_checks=collectives.export_checks())(*shard_args)


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, (fn, args) in FUNCTIONS.items():
        exported = jax.export.export(jax.jit(fn))(*args)
        (out / f"{name}.mlirbc").write_bytes(exported.mlir_module_serialized)
    for name, (fn, args, n) in SPMD_FUNCTIONS.items():
        exported = export_spmd(fn, args, n)
        (out / f"{name}.mlirbc").write_bytes(exported.mlir_module_serialized)
    for name, (fn, args, mesh) in RUNTIME_FUNCTIONS.items():
        exported = export_runtime(fn, args, mesh)
        (out / f"{name}.mlirbc").write_bytes(exported.mlir_module_serialized)


if __name__ == "__main__":
    main()
