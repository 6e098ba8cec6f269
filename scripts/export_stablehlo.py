"""Exports small JAX functions as StableHLO portable artifacts, for the PJRT backend's tests.

Usage: export_stablehlo.py OUT_DIR
Writes OUT_DIR/<name>.mlirbc (jax.export's serialized module) for each function below.
"""
import pathlib
import sys

import jax
import jax.numpy as jnp

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
}


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, (fn, args) in FUNCTIONS.items():
        exported = jax.export.export(jax.jit(fn))(*args)
        (out / f"{name}.mlirbc").write_bytes(exported.mlir_module_serialized)


if __name__ == "__main__":
    main()
