"""Every JAX collective in a pw.pmap function, checked against jax.pmap on this process's CPU
devices. Run as a script (the tests run it on an embedded cluster and on a `pw up` cluster):

    collectives_check.py collectives N [N ...]   # each collective on slices of N devices
    collectives_check.py mesh                    # each over one or both axes of a 2 x 2 mesh
    collectives_check.py overlap MODE ITERS      # psum chains on overlapping slices

Prints one line per check; exits non-zero on the first mismatch. Needs
XLA_FLAGS=--xla_force_host_platform_device_count=4 for the jax.pmap reference.
"""
import sys
import threading

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

import pathways as pw


def collectives(n, axis="i"):
    """Every collective over `axis` (a name or a tuple of names) of n ranks."""
    perm = [(i, (i + 1) % n) for i in range(n)]
    return {
        "psum": lambda x: lax.psum(x, axis),
        "pmean": lambda x: lax.pmean(x, axis),
        "pmax": lambda x: lax.pmax(x, axis),
        "pmin": lambda x: lax.pmin(x, axis),
        "all_gather": lambda x: lax.all_gather(x, axis),
        "all_gather_tiled_axis1": lambda x: lax.all_gather(x, axis, axis=1, tiled=True),
        "psum_scatter": lambda x: lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True),
        "psum_scatter_untiled": lambda x: lax.psum_scatter(x[:n], axis),
        "all_to_all": lambda x: lax.all_to_all(x, axis, 0, 0, tiled=True),
        "all_to_all_split1_concat0": lambda x: lax.all_to_all(x, axis, 1, 0, tiled=True),
        "ppermute": lambda x: lax.ppermute(x, axis, perm),
        "ppermute_partial": lambda x: lax.ppermute(x, axis, [(0, n - 1)]),
        "axis_index": lambda x: x * lax.axis_index(axis),
        "psum_in_a_loop": lambda x: lax.fori_loop(0, 3, lambda k, c: c + lax.psum(c, axis) * 0.1,
                                                  x),
        "psum_under_cond": lambda x: lax.cond(jnp.sum(x) > -1e9, lambda y: lax.psum(y, axis),
                                              lambda y: y, x),
        "grad_of_pmean": lambda x: jax.grad(lambda w: lax.pmean(jnp.sum(jnp.tanh(w * x)), axis))(x),
        # Leaves of several shapes and types, reduced together (one rendezvous per type).
        "psum_of_a_pytree": lambda x: (lambda a, b, c: a + b + c.astype(x.dtype))(
            *lax.psum((x, 2.0 * x[0], jnp.round(x * 4).astype(jnp.int32)), axis)),
    }


def check_mesh():
    """Every collective over one axis, the other, and both, of a (data 2, model 2) mesh of a
    4-device slice spread over hosts, against JAX's shard_map over the same mesh of this
    process's CPU devices; then a psum over "model" followed by one over "data"."""
    from jax.sharding import Mesh, PartitionSpec as P
    ds = pw.make_virtual_device_set()
    slc = ds.add_slice(devices=4, placement="spread", mesh=(2, 2), axis_names=("data", "model"))
    x = np.random.default_rng(0).standard_normal((4, 8, 8)).astype(np.float32)
    mesh = Mesh(np.array(jax.devices("cpu")[:4]).reshape(2, 2), ("data", "model"))
    rows = P(("data", "model"))

    def reference(fn, v):  # Each device sees its row, as under pmap.
        per_device = lambda b: fn(b[0])[None]
        return np.asarray(jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=rows,
                                                out_specs=rows, check_vma=False))(v))

    def check(name, fn):
        got = np.asarray(pw.pmap(fn, devices=slc, axis_name=("data", "model"))(x))
        np.testing.assert_allclose(got, reference(fn, x), rtol=1e-5, atol=1e-6, err_msg=name)
        print(f"ok {name}", flush=True)

    for axis, n in (("model", 2), ("data", 2), (("data", "model"), 4), (("model", "data"), 4)):
        for name, fn in collectives(n, axis).items():
            check(f"{name} over {axis}", fn)
    check("model then data",
          lambda v: lax.psum(lax.psum(v, "model") * 2.0, "data") + lax.axis_index("model"))


def check_collectives(sizes):
    ds = pw.make_virtual_device_set()
    for n in sizes:
        slc = ds.add_slice(devices=n, placement="spread")  # Over hosts: collectives cross processes.
        rng = np.random.default_rng(n)
        x = rng.standard_normal((n, 2 * n, 2 * n)).astype(np.float32)
        ref_devices = jax.devices("cpu")[:n]
        for name, fn in collectives(n).items():
            got = np.asarray(pw.pmap(fn, devices=slc, axis_name="i")(x))
            want = np.asarray(jax.pmap(fn, axis_name="i", devices=ref_devices)(x))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{name} on {n}")
            print(f"ok {name} {n}", flush=True)
        for dtype in (np.int32, np.float64, np.uint8):  # bfloat16: not yet in the client.
            with jax.enable_x64(dtype == np.float64):
                v = (np.arange(n * 6).reshape(n, 6) % 7).astype(dtype)
                got = np.asarray(pw.pmap(lambda x: lax.psum(x, "i"), devices=slc, axis_name="i")(v))
                want = np.asarray(jax.pmap(lambda x: lax.psum(x, "i"), axis_name="i",
                                           devices=ref_devices)(v))
                np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))
                print(f"ok psum {np.dtype(dtype).name} {n}", flush=True)


def overlap(mode, iters):
    """8-node psum chains on a 4-device slice and a 2-device slice of the same devices."""
    ds = pw.make_virtual_device_set()
    slices = {4: ds.add_slice(devices=4), 2: ds.add_slice(devices=2)}

    def chain(n):
        f = pw.pmap(lambda x: lax.psum(x, "i") * (1.0 / n), devices=slices[n], axis_name="i")

        @pw.program
        def p(x):
            for _ in range(8):
                x = f(x)
            return x
        return p

    programs = {n: chain(n) for n in slices}
    errors = []

    def loop(n):
        x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        want = np.broadcast_to(x.mean(axis=0), x.shape)
        for k in range(iters):
            y = np.asarray(programs[n](x))
            if not np.allclose(y, want, rtol=1e-5):
                errors.append(f"{n}-device chain, iteration {k}: {y} != {want}")

    if mode == "threads":
        threads = [threading.Thread(target=loop, args=(n,)) for n in (4, 2, 4, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    elif mode == "async":  # Calls go out without waiting; results are read at the end.
        pending = []
        for k in range(iters):
            for n in (4, 2):
                x = np.full((n, 3), k, np.float32)
                pending.append((n, k, programs[n](x)))
        for n, k, y in pending:
            if not np.allclose(np.asarray(y), k):
                errors.append(f"{n}-device chain, call {k}: {np.asarray(y)}")
    elif mode == "single":  # One loop on one slice (one of several clients).
        loop(int(sys.argv[4]) if len(sys.argv) > 4 else 4)
    else:
        raise SystemExit(f"unknown mode {mode}")
    if errors:
        raise SystemExit("\n".join(errors[:5]))
    print(f"ok overlap {mode} {iters}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "collectives":
        check_collectives([int(a) for a in sys.argv[2:]])
    elif sys.argv[1] == "mesh":
        check_mesh()
    else:
        overlap(sys.argv[2], int(sys.argv[3]))
