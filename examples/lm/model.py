"""A small decoder-only Transformer LM in plain JAX, split into pipeline stages.

The model: byte tokens (vocabulary 256, so no tokenizer to download) -> token + position
embedding -> `layers` pre-LayerNorm blocks (causal multi-head self-attention, a GELU MLP) -> a
final LayerNorm and an untied output projection. Parameters are a list of per-stage pytrees so
that the same model runs whole (one stage) or as a pipeline of S stages: stage 0 holds the
embeddings, the last stage the output head, and the blocks are split evenly among the stages.

The corpus: the license texts in /usr/share/common-licenses, which Debian's base-files package
installs on every Debian system (~250 KB of English prose: the GPL, LGPL, Apache, MPL, ...).
"""
from __future__ import annotations

import dataclasses
import glob
import os

import jax
import jax.numpy as jnp
import numpy as np

CORPUS_DIR = "/usr/share/common-licenses"


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 256  # Bytes.
    seq: int = 64
    width: int = 64
    heads: int = 4
    layers: int = 4
    mlp: int = 256


def load_corpus(directory: str = CORPUS_DIR) -> np.ndarray:
    """The corpus as bytes (uint8), its files in name order, each once (links skipped)."""
    seen, chunks = set(), []
    for path in sorted(glob.glob(os.path.join(directory, "*"))):
        real = os.path.realpath(path)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        with open(real, "rb") as f:
            chunks.append(f.read())
    if not chunks:
        raise FileNotFoundError(f"no corpus under {directory} (Debian's base-files installs it)")
    return np.frombuffer(b"\n".join(chunks), dtype=np.uint8)


def batches(corpus: np.ndarray, batch: int, seq: int, seed: int):
    """An endless stream of (tokens, targets), each (batch, seq) int32: windows of the corpus at
    random offsets, targets the next bytes."""
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(corpus) - seq - 1, size=batch)
        window = np.stack([corpus[s:s + seq + 1] for s in starts]).astype(np.int32)
        yield window[:, :-1], window[:, 1:]


def _dense(rng, fan_in, fan_out):
    return (rng.normal(0.0, 1.0 / np.sqrt(fan_in), (fan_in, fan_out))).astype(np.float32)


def _block(rng, c: Config):
    return {
        "ln1": {"g": np.ones(c.width, np.float32), "b": np.zeros(c.width, np.float32)},
        "qkv": _dense(rng, c.width, 3 * c.width),
        "out": _dense(rng, c.width, c.width),
        "ln2": {"g": np.ones(c.width, np.float32), "b": np.zeros(c.width, np.float32)},
        "up": _dense(rng, c.width, c.mlp),
        "down": _dense(rng, c.mlp, c.width),
    }


def stage_layers(c: Config, stages: int) -> list[int]:
    """How many blocks each of `stages` stages holds (the first ones take any remainder)."""
    if not 1 <= stages <= c.layers:
        raise ValueError(f"{stages} stages for {c.layers} layers: need 1 <= stages <= layers")
    return [c.layers // stages + (1 if i < c.layers % stages else 0) for i in range(stages)]


def init_params(c: Config, seed: int, stages: int = 1) -> list[dict]:
    """The model's parameters as `stages` per-stage pytrees (numpy float32). The same seed gives
    the same model whatever the number of stages."""
    rng = np.random.default_rng(seed)
    embed = {"tokens": (rng.normal(0.0, 0.02, (c.vocab, c.width))).astype(np.float32),
             "positions": (rng.normal(0.0, 0.02, (c.seq, c.width))).astype(np.float32)}
    blocks = [_block(rng, c) for _ in range(c.layers)]
    head = {"ln": {"g": np.ones(c.width, np.float32), "b": np.zeros(c.width, np.float32)},
            "out": _dense(rng, c.width, c.vocab)}
    params, start = [], 0
    for i, n in enumerate(stage_layers(c, stages)):
        p = {"blocks": blocks[start:start + n]}
        start += n
        if i == 0:
            p["embed"] = embed
        if i == stages - 1:
            p["head"] = head
        params.append(p)
    return params


def _layer_norm(p, x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["g"] + p["b"]


def _attention(c: Config, p, x):
    """Causal self-attention over the heads whose columns `p` holds (all of them, or one model-
    parallel rank's share)."""
    b, t, _ = x.shape
    q, k, v = jnp.split(x @ p["qkv"], 3, axis=-1)
    head = c.width // c.heads
    heads = q.shape[-1] // head
    split = lambda y: y.reshape(b, t, heads, head).transpose(0, 2, 1, 3)
    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(head)
    causal = jnp.tril(jnp.ones((t, t), bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    y = jax.nn.softmax(scores, axis=-1) @ v
    return y.transpose(0, 2, 1, 3).reshape(b, t, heads * head) @ p["out"]


def tensor_parallel(axis: str):
    """Megatron's two operators for a block split over mesh axis `axis`: `enter` (identity
    forward, a psum of the gradient backward) where a replicated activation enters the split
    layers, `leave` (a psum forward, identity backward) where their partial sums leave."""
    @jax.custom_vjp
    def enter(x):
        return x

    enter.defvjp(lambda x: (x, None), lambda _, g: (jax.lax.psum(g, axis),))

    @jax.custom_vjp
    def leave(x):
        return jax.lax.psum(x, axis)

    leave.defvjp(lambda x: (jax.lax.psum(x, axis), None), lambda _, g: (g,))
    return enter, leave


def _block_forward(c: Config, p, x, tp=None):
    enter, leave = tp if tp is not None else (lambda y: y, lambda y: y)
    x = x + leave(_attention(c, p, enter(_layer_norm(p["ln1"], x))))
    return x + leave(jax.nn.gelu(enter(_layer_norm(p["ln2"], x)) @ p["up"]) @ p["down"])


def stage_forward(c: Config, p, x, tp=None):
    """One stage: tokens (int) or activations in, activations (or, last stage, logits) out.
    `tp`: tensor_parallel's operators when the blocks' parameters are one model-parallel rank's
    (shard_params)."""
    if "embed" in p:
        x = p["embed"]["tokens"][x] + p["embed"]["positions"][: x.shape[1]]
    for block in p["blocks"]:
        x = _block_forward(c, block, x, tp)
    if "head" in p:
        x = _layer_norm(p["head"]["ln"], x) @ p["head"]["out"]
    return x


def _split_block(c: Config, block, ranks: int):
    """A block's parameters for each of `ranks` model-parallel ranks (Megatron's split): rank m
    holds heads [m H/M, (m+1) H/M) (their q, k, v columns and their rows of the output
    projection) and the same share of the MLP's hidden units; LayerNorms are replicated."""
    def cols(a, m):
        k = a.shape[1] // ranks
        return a[:, m * k:(m + 1) * k]

    def rows(a, m):
        k = a.shape[0] // ranks
        return a[m * k:(m + 1) * k]

    q, k, v = np.split(np.asarray(block["qkv"]), 3, axis=1)
    return [{"ln1": block["ln1"], "ln2": block["ln2"],
             "qkv": np.concatenate([cols(q, m), cols(k, m), cols(v, m)], axis=1),
             "out": rows(np.asarray(block["out"]), m), "up": cols(np.asarray(block["up"]), m),
             "down": rows(np.asarray(block["down"]), m)} for m in range(ranks)]


def _join_block(shards):
    """The whole block from its model-parallel ranks' shares (inverse of _split_block)."""
    parts = [np.split(np.asarray(s["qkv"]), 3, axis=1) for s in shards]
    qkv = np.concatenate([np.concatenate([p[j] for p in parts], axis=1) for j in range(3)], axis=1)
    cat = lambda key, axis: np.concatenate([np.asarray(s[key]) for s in shards], axis=axis)
    return {"ln1": shards[0]["ln1"], "ln2": shards[0]["ln2"], "qkv": qkv, "out": cat("out", 0),
            "up": cat("up", 1), "down": cat("down", 0)}


def check_model_parallel(c: Config, ranks: int) -> None:
    if ranks < 1 or c.heads % ranks or c.mlp % ranks:
        raise ValueError(f"{ranks} model-parallel ranks must divide the {c.heads} heads and the "
                         f"{c.mlp} MLP units")


def shard_params(c: Config, params: list, ranks: int) -> list[list]:
    """Each model-parallel rank's parameters (a list of stages, as `params`): the blocks split
    (_split_block), embeddings and head replicated."""
    check_model_parallel(c, ranks)
    out = [[] for _ in range(ranks)]
    for p in params:
        blocks = [_split_block(c, b, ranks) for b in p["blocks"]]
        for m in range(ranks):
            out[m].append({**p, "blocks": [b[m] for b in blocks]})
    return out


def join_params(shards: list[list]) -> list:
    """The whole model's parameters from every model-parallel rank's (shard_params' inverse)."""
    return [{**stages[0], "blocks": [_join_block([s[i]["blocks"][j] for s in shards])
                                     for j in range(len(stages[0]["blocks"]))]}
            for i, stages in enumerate(zip(*shards))]


def cross_entropy(logits, targets):
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def loss(c: Config, params: list, tokens, targets, tp=None):
    """The whole model's mean next-byte loss (params: every stage's, in order; `tp`: see
    stage_forward)."""
    x = tokens
    for p in params:
        x = stage_forward(c, p, x, tp)
    return cross_entropy(x, targets)


def sgd(params, grads, lr):
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)
