"""Trains the byte-level Transformer LM of model.py in three parallel layouts of the same model,
the same global batch and the same number of devices, and checks each against plain JAX on one
device:

- spmd:              data x model parallel over a slice of `stages` devices on one island, a
                     (data, model) mesh with `--model-parallel` ranks (default 2) per group
                     (pw.pmap over both axes: each data-parallel group takes its share of the
                     batch; each model-parallel rank holds its share of every block's heads
                     and MLP units, Megatron's split, their partial sums meeting in a psum over
                     "model"; the gradients are averaged over "data" inside the compiled step);
- pipeline:          GPipe: `stages` stages, each on its own one-device slice of one island,
                     `--microbatches` microbatches; one @pw.program per step runs every
                     microbatch forward through the stages, then backward (each stage's forward
                     keeps what its backward needs on its device; with --remat the backward
                     recomputes it, as GPipe does to save memory), sums each stage's gradients
                     on its own device and applies them there;
- pipeline_2islands: the same pipeline with the first half of its stages on island 0 and the
                     rest on island 1, so activations and gradients cross DCN.

    .venv/bin/python examples/lm/train.py [--layouts spmd,pipeline,pipeline_2islands]
        [--steps 5] [--batch 16] [--microbatches 4] [--stages 4] [--model-parallel 2]

Each layout prints its loss per step, then the relative difference of its last loss and its
parameters from the one-device run's (the check: within 1e-5), then runs `--timed-steps` more
steps back to back (each step's parameters feed the next; one wait at the end) and reports
tokens/s, the fraction of its devices' time they were idle during those steps (for the pipelines,
the bubble and the dispatch gaps: GPipe's bubble alone is (S-1)/(M+S-1)), and the DCN bytes
received per step (from the cluster's status). The cluster is the one at PW_CLUSTER (e.g. `pw up
--islands 2 --hosts-per-island 2 --devices-per-host 2`), else an embedded one of that shape.

With --json (`pw bench lm --json`), one JSON object on stdout: {"results": [{"layout",
"tokens_per_second", "bubble_fraction", "dcn_bytes_per_step", "loss_rel_diff_vs_one_device",
"params_rel_diff_vs_one_device", "gpipe_bubble_fraction", "losses"} (spmd's also "mesh": {"data",
"model"}), ...], "one_device_losses"};
progress goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as lm  # noqa: E402

import pathways as pw  # noqa: E402

LAYOUTS = ("spmd", "pipeline", "pipeline_2islands")
TOLERANCE = 1e-5
LEARNING_RATE = 0.1


def relative_difference(ours, theirs) -> float:
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    return float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-30))


def flat(params) -> np.ndarray:
    """Every parameter in one vector, in the model's order whatever its split into stages."""
    embed = [p["embed"] for p in params if "embed" in p]
    blocks = [b for p in params for b in p["blocks"]]
    head = [p["head"] for p in params if "head" in p]
    leaves = jax.tree.leaves([embed, blocks, head])
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in leaves])


def one_device(c, args, data):
    """The reference: the whole model on one device, the whole batch."""
    params = lm.init_params(c, args.seed, 1)

    @jax.jit
    def step(params, tokens, targets):
        value, grads = jax.value_and_grad(lambda p: lm.loss(c, p, tokens, targets))(params)
        return lm.sgd(params, grads, LEARNING_RATE), value

    losses = []
    for tokens, targets in data:
        params, value = step(params, tokens, targets)
        losses.append(float(value))
    return params, losses


def spmd(c, args, vds):
    """Data x model parallel over one slice of `stages` devices, a (data, model) mesh of
    `--model-parallel` ranks per data-parallel group: each group takes its share of the batch;
    inside a group each rank holds its share of every block's heads and MLP units (Megatron's
    split, lm.shard_params) and the blocks' partial sums meet in a psum over "model"; the
    gradients are averaged over "data". One compiled step per call."""
    n, mp = args.stages, args.model_parallel
    dp = n // mp
    devices = vds.add_slice(devices=n, mesh=(dp, mp), axis_names=("data", "model"))
    tp = lm.tensor_parallel("model") if mp > 1 else None

    def step(params, tokens, targets):
        value, grads = jax.value_and_grad(lambda p: lm.loss(c, p, tokens, targets, tp))(params)
        grads, value = jax.lax.pmean((grads, value), "data")
        return lm.sgd(params, grads, LEARNING_RATE), value

    step_fn = pw.pmap(step, devices=devices, axis_name=("data", "model"), in_axes=0,
                      out_axes=(0, None))

    @pw.program
    def train_step(params, tokens, targets):
        return step_fn(params, tokens, targets)

    def per_rank(x):  # Rank (d, m) takes data-parallel group d's share of the batch.
        return np.repeat(x.reshape((dp, x.shape[0] // dp) + x.shape[1:]), mp, axis=0)

    def run(params, tokens, targets):
        return train_step(params, per_rank(tokens), per_rank(targets))

    # Each device's parameters, stacked along a leading axis in rank order (row-major).
    shards = lm.shard_params(c, lm.init_params(c, args.seed, 1), mp)
    params = jax.tree.map(lambda *xs: np.stack(xs), *[shards[r % mp] for r in range(n)])

    def whole(params):  # Data-parallel group 0's ranks hold the whole model between them.
        ranks = [jax.tree.map(lambda x: np.asarray(x)[m], params) for m in range(mp)]
        return lm.join_params(ranks)

    return run, params, [devices], whole


def pipeline(c, args, vds, islands):
    """GPipe over `stages` one-device slices; `islands`: each stage's island. Each stage's
    forward keeps what its backward needs (jax.vjp's residuals, returned by the forward call and
    left on the stage's device), unless `--remat`: then the backward recomputes the forward, as
    GPipe does to save memory (a third more computation). Each backward call also adds its
    gradients to the stage's running sum, and the last microbatch's applies them: one call per
    stage and microbatch, whatever the accumulation."""
    s_count, m_count = args.stages, args.microbatches
    slices = [vds.add_slice(devices=1, island=islands[i]) for i in range(s_count)]

    def stage_vjp(i, p, x):  # Stage 0's tokens are not differentiated.
        if i == 0:
            return jax.vjp(lambda p: lm.stage_forward(c, p, x), p)
        return jax.vjp(lambda p, x: lm.stage_forward(c, p, x), p, x)

    # Each stage's gradients as a tuple, the parameters' first: the last stage's from the targets
    # (and its loss), the others' from the output's gradient and what the forward kept (or, with
    # --remat, the parameters and input to recompute it).
    def last_core(p, x, targets):
        value, (dp, dx) = jax.value_and_grad(
            lambda p, x: lm.cross_entropy(lm.stage_forward(c, p, x), targets), argnums=(0, 1))(p, x)
        return dp, dx, value

    def core(i):
        if args.remat:
            return lambda p, x, dy: tuple(stage_vjp(i, p, x)[1](dy))
        return lambda kept, dy: tuple(kept(dy))

    add = lambda a, b: jax.tree.map(jnp.add, a, b)
    update = lambda p, g: lm.sgd(p, jax.tree.map(lambda x: x / m_count, g), LEARNING_RATE)

    def variants(grads, s):
        """The stage's backward for the first microbatch, the middle ones (adding to the running
        sum `acc`) and the last (then applying the sum to the parameters `p`)."""
        first = lambda *a: grads(*a)
        more = lambda acc, *a: (lambda r: (add(acc, r[0]),) + r[1:])(grads(*a))
        if m_count == 1:
            last = lambda p, acc, *a: (lambda r: (update(p, r[0]),) + r[1:])(grads(*a))
        else:
            last = lambda p, acc, *a: (lambda r: (update(p, add(acc, r[0])),) + r[1:])(grads(*a))
        return pw.jit(first, s), pw.jit(more, s), pw.jit(last, s)

    forward = [pw.jit((lambda i: lambda p, x: lm.stage_forward(c, p, x) if args.remat
                       else stage_vjp(i, p, x))(i), slices[i]) for i in range(s_count - 1)]
    backward = [variants(core(i), slices[i]) for i in range(s_count - 1)]
    backward.append(variants(last_core, slices[-1]))

    @pw.program
    def train_step(params, tokens, targets):
        inputs, kept = [], []  # [m][i]: stage i's input / what its forward kept, microbatch m.
        for m in range(m_count):  # Every microbatch forward...
            xs, ks = [tokens[m]], []
            for i in range(s_count - 1):
                if args.remat:
                    xs.append(forward[i](params[i], xs[-1]))
                else:
                    y, k = forward[i](params[i], xs[-1])
                    xs.append(y)
                    ks.append(k)
            inputs.append(xs)
            kept.append(ks)
        acc, losses = [None] * s_count, []
        for m in range(m_count):  # ...then backward, last stage first.
            dy = None
            for i in range(s_count - 1, -1, -1):
                if i == s_count - 1:
                    a = (params[i], inputs[m][i], targets[m])
                else:
                    a = (params[i], inputs[m][i], dy) if args.remat else (kept[m][i], dy)
                first, more, last = backward[i]
                if m == m_count - 1:
                    r = last(params[i], acc[i], *a) if m_count > 1 else last(params[i], None, *a)
                else:
                    r = first(*a) if m == 0 else more(acc[i], *a)
                acc[i] = r[0]
                if i == s_count - 1:
                    losses.append(r[2])
                if i > 0:
                    dy = r[1]
        return acc, losses  # After the last microbatch: each stage's new parameters.

    def run(params, tokens, targets):
        mb = tokens.shape[0] // m_count
        split = lambda a: [a[m * mb:(m + 1) * mb] for m in range(m_count)]
        return train_step(params, split(tokens), split(targets))

    return run, lm.init_params(c, args.seed, s_count), slices, lambda params: params


def counters(devices) -> tuple[float, int]:
    """The busy seconds of `devices` summed, and the DCN bytes received over the cluster."""
    s = pw.status()
    busy = {d["device"]: d["busy_seconds"] for h in s["hosts"] for d in h["devices"]}
    return (sum(busy[d] for d in devices),
            sum(int(h.get("dcn_bytes_received", 0)) for h in s["hosts"]))


def train(layout, c, args, data, vds, log):
    if layout == "spmd":
        run, params, slices, whole = spmd(c, args, vds)
    else:
        half = args.stages // 2
        islands = ([0] * args.stages if layout == "pipeline"
                   else [0] * half + [1] * (args.stages - half))
        run, params, slices, whole = pipeline(c, args, vds, islands)
    log(f"{layout}: devices {[s.devices[0] if s.num_devices == 1 else s.devices for s in slices]}"
        f" on islands {sorted({i for s in slices for i in s.islands})}")
    mean = lambda v: float(np.mean([float(x) for x in v])) if isinstance(v, list) else float(v)
    losses = []
    for step, (tokens, targets) in enumerate(data):
        t0 = time.perf_counter()
        params, value = run(params, tokens, targets)
        losses.append(mean(value))
        log(f"  step {step + 1:3d}  loss {losses[-1]:.6f}  "
            f"{(time.perf_counter() - t0) * 1e3:8.1f} ms")
    checked = whole(params)
    devices = [d for s in slices for d in s.devices]
    busy0, dcn0 = counters(devices)
    t0 = time.perf_counter()
    for step in range(args.timed_steps):  # Back to back: one wait, at the end.
        tokens, targets = data[step % len(data)]
        params, value = run(params, tokens, targets)
    mean(value)
    wall = time.perf_counter() - t0
    busy1, dcn1 = counters(devices)
    for s in slices:
        s.release()
    timing = {"tokens_per_second": args.timed_steps * args.batch * c.seq / wall,
              "bubble_fraction": max(0.0, 1.0 - (busy1 - busy0) / (len(devices) * wall)),
              "dcn_bytes_per_step": (dcn1 - dcn0) / args.timed_steps}
    return checked, losses, timing


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--stages", type=int, default=4, help="pipeline stages = devices")
    parser.add_argument("--model-parallel", type=int, default=2,
                        help="spmd: model-parallel ranks per data-parallel group (must divide "
                             "--stages, the heads and the MLP units; 1: data-parallel only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--remat", action="store_true",
                        help="pipelines: each stage's backward recomputes its forward (GPipe's "
                             "rematerialization) instead of keeping its activations")
    parser.add_argument("--timed-steps", type=int, default=20,
                        help="steps after the checked ones, timed back to back")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout at the end")
    args = parser.parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    log = lambda line: print(line, file=out, flush=True)
    layouts = [l for l in args.layouts.split(",") if l]
    for l in layouts:
        if l not in LAYOUTS:
            parser.error(f"--layouts: unknown layout {l!r} (known: {', '.join(LAYOUTS)})")
    if args.batch % args.microbatches or args.batch % args.stages:
        parser.error(f"--batch {args.batch} must divide by --microbatches and --stages")
    if args.steps < 1 or args.timed_steps < 1 or args.stages < 2:
        parser.error("--steps and --timed-steps must be at least 1, --stages at least 2")
    c = lm.Config()
    if (args.model_parallel < 1 or args.stages % args.model_parallel
            or args.batch % (args.stages // args.model_parallel)):
        parser.error(f"--model-parallel {args.model_parallel} must divide --stages "
                     f"{args.stages}, and the data-parallel width --batch {args.batch}")
    try:
        lm.check_model_parallel(c, args.model_parallel)
    except ValueError as e:
        parser.error(f"--model-parallel: {e}")
    corpus = lm.load_corpus()
    stream = lm.batches(corpus, args.batch, c.seq, args.seed)
    data = [next(stream) for _ in range(args.steps)]
    log(f"corpus: {len(corpus)} bytes from {lm.CORPUS_DIR}; model: {c}")
    ref_params, ref_losses = one_device(c, args, data)
    log(f"one device: loss {ref_losses[0]:.6f} -> {ref_losses[-1]:.6f}")
    vds = pw.make_virtual_device_set()
    results, ok = [], True
    for layout in layouts:
        params, losses, timing = train(layout, c, args, data, vds, log)
        loss_diff = abs(losses[-1] - ref_losses[-1]) / abs(ref_losses[-1])
        param_diff = relative_difference(flat(params), flat(ref_params))
        good = loss_diff <= TOLERANCE and param_diff <= TOLERANCE
        ok = ok and good
        gpipe = ((args.stages - 1) / (args.microbatches + args.stages - 1)
                 if layout != "spmd" else 0.0)
        log(f"{layout}: after {args.steps} steps loss {losses[-1]:.6f} vs one device "
            f"{ref_losses[-1]:.6f} (relative difference {loss_diff:.1e}), parameters "
            f"{param_diff:.1e}: {'OK' if good else 'MISMATCH'}; {args.timed_steps} more steps: "
            f"{timing['tokens_per_second']:.0f} tokens/s, devices idle "
            f"{timing['bubble_fraction']:.2f} of the time (GPipe's bubble: {gpipe:.2f}), "
            f"{timing['dcn_bytes_per_step']:.0f} DCN bytes/step")
        if layout == "spmd":
            timing["mesh"] = {"data": args.stages // args.model_parallel,
                              "model": args.model_parallel}
        results.append({"layout": layout, **timing, "loss_rel_diff_vs_one_device": loss_diff,
                        "params_rel_diff_vs_one_device": param_diff,
                        "gpipe_bubble_fraction": gpipe, "losses": losses})
    if args.json:
        print(json.dumps({"results": results, "one_device_losses": ref_losses}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
