"""pw.checkpoint (issue 25 item 3): checkpoints written and read by the workers in Orbax's layout.

On the embedded cluster (2 islands x 1 host x 4 devices); test_cluster.py covers a `pw up`
cluster (the checkpoint root, and a worker lost during a save).
"""
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import pathways as pw


@pytest.fixture
def ds():
    return pw.make_virtual_device_set()


def test_round_trip_is_bit_exact_and_restores_onto_another_sharding(ds, tmp_path):
    four = ds.add_slice(devices=4)
    two = ds.add_slice(devices=2)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 6)).astype(np.float32)
    e = rng.standard_normal((4, 3)).astype(ml_dtypes.bfloat16)
    steps = np.arange(4, dtype=np.int32)
    tree = {"params": {"w": pw.device_put(w, four), "e": pw.device_put(e, four)},
            "steps": [pw.device_put(steps, four)]}
    path = pw.checkpoint.save(tree, tmp_path / "ck").wait()
    assert path == str(tmp_path / "ck")
    assert sorted(os.listdir(path)) == ["_CHECKPOINT_METADATA", "_METADATA", "_sharding",
                                        "commit_success.txt", "params.e", "params.w", "steps.0"]
    assert sorted(os.listdir(f"{path}/params.w")) == [".zarray", "0.0", "1.0", "2.0", "3.0"]
    assert [p for p in os.listdir(tmp_path) if "tmp" in p] == []  # Renamed, nothing left.
    # The same layout back, bit for bit.
    back = pw.checkpoint.restore(path, like=tree)
    np.testing.assert_array_equal(np.asarray(back["params"]["w"]), w)
    assert np.asarray(back["params"]["e"]).tobytes() == e.tobytes()
    np.testing.assert_array_equal(np.asarray(back["steps"][0]), steps)
    assert back["params"]["w"].sharding.shard_shape((8, 6)) == (2, 6)
    # Another sharding (halves on two devices: each from two chunks; and replicated).
    like = {"params": {"w": pw.device_put(np.zeros_like(w), two),
                       "e": pw.device_put(np.zeros_like(e), two,
                                          sharding=jax.sharding.PartitionSpec())},
            "steps": [pw.device_put(np.zeros_like(steps), two)]}
    back = pw.checkpoint.restore(path, like=like)
    np.testing.assert_array_equal(np.asarray(back["params"]["w"]), w)
    assert back["params"]["w"].sharding.shard_shape((8, 6)) == (4, 6)
    assert np.asarray(back["params"]["e"]).tobytes() == e.tobytes()
    assert back["params"]["e"].sharding.is_fully_replicated


def test_saves_commit_in_order_and_an_existing_checkpoint_is_not_overwritten(ds, tmp_path):
    s = ds.add_slice(devices=2)
    a = pw.device_put(np.arange(4, dtype=np.float32), s)
    first = pw.checkpoint.save({"a": a}, tmp_path / "1")
    second = pw.checkpoint.save({"a": a + 1}, tmp_path / "2")
    second.wait()
    assert first.done()  # The second's commit came after the first's.
    times = [json.loads((tmp_path / n / "_CHECKPOINT_METADATA").read_text())
             ["commit_timestamp_nsecs"] for n in ("1", "2")]
    assert times[0] <= times[1]
    again = pw.checkpoint.save({"a": a}, tmp_path / "1")
    with pytest.raises(pw.errors.AlreadyExists, match="a checkpoint exists at"):
        again.wait()
    np.testing.assert_array_equal(np.asarray(pw.checkpoint.restore(tmp_path / "1", {"a": a})["a"]),
                                  np.arange(4, dtype=np.float32))
    with pytest.raises(TypeError, match="leaf b is a str, neither a pw.Array nor an array"):
        pw.checkpoint.save({"a": a, "b": "three"}, tmp_path / "3")
    with pytest.raises(ValueError, match="the tree has no pw.Array"):
        pw.checkpoint.save({"b": np.ones(3)}, tmp_path / "3")
    with pytest.raises(ValueError, match="both name the directory a.b"):
        pw.checkpoint.save({"a.b": a, "a": {"b": a}}, tmp_path / "3")
    with pytest.raises(ValueError, match="a leaf named _METADATA"):
        pw.checkpoint.save({"_METADATA": a}, tmp_path / "3")
    with pytest.raises(pw.errors.NotFound, match="nothing/a/.zarray"):
        pw.checkpoint.restore(tmp_path / "nothing", {"a": a})
    with pytest.raises(pw.errors.InvalidArgument, match=r"is f32\[4\], not f32\[2\]"):
        pw.checkpoint.restore(tmp_path / "1", {"a": pw.device_put(np.zeros(2, np.float32), s)})


def test_host_values_are_saved_through_the_trees_slice_and_restored_as_they_were(ds, tmp_path):
    s = ds.add_slice(devices=2)
    tree = {"w": pw.device_put(np.arange(4, dtype=np.float32), s), "step": 7, "lr": 0.5,
            "mask": np.array([True, False]), "seed": np.int32(3)}
    path = pw.checkpoint.save(tree, tmp_path / "ck").wait()
    meta = json.loads((tmp_path / "ck" / "_METADATA").read_text())["tree_metadata"]
    assert meta["('step',)"]["value_metadata"]["value_type"] == "np.ndarray"
    assert meta["('w',)"]["value_metadata"]["value_type"] == "jax.Array"
    back = pw.checkpoint.restore(path, like=tree)
    assert back["step"] == 7 and type(back["step"]) is int
    assert back["lr"] == 0.5 and type(back["lr"]) is float
    np.testing.assert_array_equal(back["mask"], [True, False])
    assert back["seed"] == 3 and back["seed"].dtype == np.int32
    np.testing.assert_array_equal(np.asarray(back["w"]), np.arange(4, dtype=np.float32))


def test_stock_orbax_and_tensorstore_read_it(ds, tmp_path):
    import orbax.checkpoint as ocp
    import tensorstore as ts
    s = ds.add_slice(devices=4)
    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    b = np.array([1.5, -2.0], np.float32)
    path = pw.checkpoint.save({"w": pw.device_put(w, s),
                               "b": pw.device_put(b, s, sharding=jax.sharding.PartitionSpec()),
                               "step": 5}, tmp_path / "ck").wait()
    got = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": f"{path}/w"}}).result()
    np.testing.assert_array_equal(got.read().result(), w)
    restored = ocp.PyTreeCheckpointer().restore(
        path, args=ocp.args.PyTreeRestore(restore_args={
            "w": ocp.RestoreArgs(restore_type=np.ndarray),
            "b": ocp.RestoreArgs(restore_type=np.ndarray),
            "step": ocp.RestoreArgs(restore_type=np.ndarray)}))
    np.testing.assert_array_equal(restored["w"], w)
    np.testing.assert_array_equal(restored["b"], b)
    assert int(restored["step"]) == 5
    # Without arguments, Orbax restores every array onto this process's cpu:0 (`_sharding`).
    plain = ocp.PyTreeCheckpointer().restore(path)
    np.testing.assert_array_equal(np.asarray(plain["w"]), w)
    assert isinstance(plain["w"], jax.Array) and int(plain["step"]) == 5


def test_a_stock_orbax_checkpoint_restores_resharded(ds, tmp_path):
    # Written by stock Orbax (zstd chunks of a 2 x 2 mesh's shards), in a process of its own
    # with 4 CPU devices; read back by the workers as halves and as whole replicas.
    script = textwrap.dedent(f"""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import jax, jax.numpy as jnp, numpy as np
        import orbax.checkpoint as ocp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))
        w = jax.device_put(jnp.arange(48, dtype=jnp.float32).reshape(8, 6),
                           NamedSharding(mesh, P("x", "y")))
        c = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_zarr3=False))
        c.save("{tmp_path}/stock", args=ocp.args.PyTreeSave({{"layer": {{"w": w}}}}))
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=300,
                   env=dict(os.environ, JAX_PLATFORMS="cpu"))
    zarray = json.loads((tmp_path / "stock" / "layer.w" / ".zarray").read_text())
    assert zarray["compressor"]["id"] == "zstd" and zarray["chunks"] == [4, 3]
    want = np.arange(48, dtype=np.float32).reshape(8, 6)
    for slice_devices, spec in ((2, None), (4, jax.sharding.PartitionSpec())):
        s = ds.add_slice(devices=slice_devices)
        like = {"layer": {"w": pw.device_put(np.zeros((8, 6), np.float32), s, sharding=spec)}}
        got = pw.checkpoint.restore(tmp_path / "stock", like)
        np.testing.assert_array_equal(np.asarray(got["layer"]["w"]), want)


def test_training_resumed_from_a_checkpoint_reproduces_the_loss_curve(ds, tmp_path):
    s = ds.add_slice(devices=4)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 16, 8)).astype(np.float32)  # Per device: 16 examples.
    y = rng.standard_normal((4, 16, 1)).astype(np.float32)

    def step(w, x, y):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - 0.1 * jax.lax.pmean(g, "d"), jax.lax.pmean(loss, "d")

    train = pw.pmap(step, devices=s, axis_name="d")
    xs, ys = pw.device_put(x, s), pw.device_put(y, s)
    w0 = np.broadcast_to(rng.standard_normal((8, 1)).astype(np.float32), (4, 8, 1)).copy()

    def run(w, n):
        losses = []
        for _ in range(n):
            w, loss = train(w, xs, ys)
            losses.append(np.asarray(loss)[0])
        return w, losses

    _, straight = run(pw.device_put(w0, s), 6)
    w, first = run(pw.device_put(w0, s), 3)
    path = pw.checkpoint.save({"w": w}, tmp_path / "step3").wait()
    resumed = pw.checkpoint.restore(path, like={"w": pw.device_put(np.zeros_like(w0), s)})
    _, rest = run(resumed["w"], 3)
    assert first + rest == straight  # Exactly: the same bits go on.
