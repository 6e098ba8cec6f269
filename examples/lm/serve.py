"""Serving the LM of model.py from its live weights while it trains, as a tenant of its own.

The trainer (this process's client) trains the LM data-parallel on a slice of island 0 (the
spmd layout of train.py, its parameters one flat array on the devices), submitting steps ahead
of their completion, and publishes the newest version that is ready under one share token
(`params.share(token=t)`). The server is another client of the
cluster, connected as tenant "serve" with its own share of each island's device time
(`--serve-share`), on a one-device slice of its own on island 1: for each request (a prompt) it
imports the token's current weights (`pw.Array.from_shared`, no copy through any host) and
generates greedily, `--new-tokens` bytes in one compiled call (every step re-reads the whole
window: static shapes).

The run: `--steps` training steps with no requests (tokens/s alone), then `--steps` more while a
requester sends the server prompts back to back (tokens/s beside serving, and each request's
latency: p50/p99). At the end the server answers one prompt with the final weights, and the
answer is checked against the same model in plain JAX on this process's CPU: each generated
byte must be the argmax of the reference logits at its position (within 1e-4 of the maximum,
for ties).

    .venv/bin/python examples/lm/serve.py [--steps 20] [--new-tokens 16] [--serve-share 1]
        [--json]

On an embedded cluster the server is a second client in this process (a thread); with
PW_CLUSTER naming a running cluster (`pw up --islands 2 ...`) it is a second process, started
here (`serve.py --serve`: requests on stdin, answers on stdout, one JSON line each).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as lm  # noqa: E402

import pathways as pw  # noqa: E402

LEARNING_RATE = 0.1
PROMPT = 16  # Bytes of prompt the server takes (left-padded with spaces, or its last 16).
TIE = 1e-4


def encode(prompt: str, c: lm.Config) -> np.ndarray:
    """The model's window: the prompt's last PROMPT bytes, left-padded; zeros after."""
    raw = prompt.encode("utf-8", "replace")[-PROMPT:].rjust(PROMPT, b" ")
    window = np.zeros(c.seq, np.int32)
    window[:PROMPT] = np.frombuffer(raw, np.uint8)
    return window


def generate_fn(c: lm.Config, unravel, new_tokens: int):
    """Greedy decoding of `new_tokens` bytes after the prompt, in one computation."""
    def generate(flat, window):
        params = unravel(flat)

        def step(i, w):
            logits = lm.stage_forward(c, params[0], w[None])[0]
            return w.at[i].set(jnp.argmax(logits[i - 1]).astype(jnp.int32))
        return jax.lax.fori_loop(PROMPT, PROMPT + new_tokens, step, window)
    return generate


def serve(client, c, unravel, new_tokens, requests, answer):
    """The server: for each (token, prompt), imports the weights and generates."""
    devices = client.make_virtual_device_set().add_slice(devices=1, island=1)
    generate = pw.jit(generate_fn(c, unravel, new_tokens), devices)
    while True:
        request = requests()
        if request is None:
            return
        t0 = time.perf_counter()
        try:
            weights = pw.Array.from_shared(request["token"], client=client)
            window = np.asarray(generate(weights, encode(request["prompt"], c)))
        except pw.errors.Error as e:
            answer({"error": str(e)})
            continue
        answer({"window": window.tolist(), "ms": (time.perf_counter() - t0) * 1e3,
                "text": bytes(window[PROMPT:PROMPT + new_tokens].astype(np.uint8)).decode(
                    "utf-8", "replace")})


def config_and_unravel(seed):
    c = lm.Config()
    flat, unravel = ravel_pytree(lm.init_params(c, seed, 1))
    return c, flat, unravel


def server_main(args):  # The server as its own process: JSON requests on stdin.
    pw.connect()
    client = pw.Client("server", tenant="serve", share=args.serve_share)
    c, _, unravel = config_and_unravel(args.seed)

    def requests():
        line = sys.stdin.readline()
        return json.loads(line) if line.strip() else None

    def answer(a):
        print(json.dumps(a), flush=True)
    serve(client, c, unravel, args.new_tokens, requests, answer)


class Server:
    """The server, in a thread (embedded cluster) or a process (a running cluster)."""

    def __init__(self, args, c, unravel):
        self._lock = threading.Lock()  # One request at a time.
        self._closed = None  # close()'s result once closed.
        if os.environ.get("PW_CLUSTER"):
            self._proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--serve", "--seed", str(args.seed),
                 "--new-tokens", str(args.new_tokens), "--serve-share", str(args.serve_share)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        else:
            self._proc = None
            self._requests, self._answers = queue.Queue(), queue.Queue()
            client = pw.Client("server", tenant="serve", share=args.serve_share)
            self._thread = threading.Thread(
                target=serve, args=(client, c, unravel, args.new_tokens, self._requests.get,
                                    self._answers.put), daemon=True)
            self._thread.start()

    def ask(self, token, prompt):
        with self._lock:
            request = {"token": token, "prompt": prompt}
            if self._proc is not None:
                self._proc.stdin.write(json.dumps(request) + "\n")
                self._proc.stdin.flush()
                line = self._proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"the server exited ({self._proc.wait()})")
                answer = json.loads(line)
            else:
                self._requests.put(request)
                answer = self._answers.get(timeout=300)
        if "error" in answer:
            raise RuntimeError(f"the server: {answer['error']}")
        return answer

    def close(self):
        """Ends the server (once; later calls return the same)."""
        if self._closed is None:
            if self._proc is not None:
                self._proc.stdin.close()
                self._closed = self._proc.wait(timeout=120)
            else:
                self._requests.put(None)
                self._thread.join(timeout=120)
                self._closed = 0
        return self._closed


def check(c, unravel, flat, window, new_tokens) -> float:
    """The largest gap between a generated byte's reference logit and the reference maximum."""
    logits = np.asarray(lm.stage_forward(c, unravel(jnp.asarray(flat))[0],
                                         jnp.asarray(window)[None])[0])
    gaps = [float(logits[i - 1].max() - logits[i - 1][window[i]])
            for i in range(PROMPT, PROMPT + new_tokens)]
    return max(gaps)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps alone, then as many serving")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--devices", type=int, default=2, help="the trainer's data-parallel width")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--serve-share", type=float, default=1.0,
                        help="the serving tenant's share of each island's device time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout at the end")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        server_main(args)
        return 0
    if not 1 <= args.new_tokens <= lm.Config().seq - PROMPT:
        parser.error(f"--new-tokens must be in [1, {lm.Config().seq - PROMPT}]")
    if args.steps < 2 or args.batch % args.devices:
        parser.error("--steps must be at least 2 and --batch divide by --devices")
    out = sys.stderr if args.json else sys.stdout
    log = lambda line: print(line, file=out, flush=True)

    c, flat, unravel = config_and_unravel(args.seed)
    trainer = pw.make_virtual_device_set().add_slice(devices=args.devices, island=0)

    def flat_step(flat, tokens, targets):
        loss_of = lambda f: lm.loss(c, unravel(f), tokens, targets)
        value, grad = jax.value_and_grad(loss_of)(flat)
        grad, value = jax.lax.pmean((grad, value), "batch")
        return flat - LEARNING_RATE * grad, value

    step = pw.pmap(flat_step, devices=trainer, axis_name="batch", in_axes=(None, 0, 0),
                   out_axes=None)
    stream = lm.batches(lm.load_corpus(), args.batch, c.seq, args.seed)
    shape = (args.devices, args.batch // args.devices, c.seq)

    def train(n, flat, token):
        """n steps back to back (the last one waited for). After each, the newest parameters
        that are ready are published: the steps run ahead of the host, and a server importing
        a step still queued would wait for every step before it."""
        t0 = time.perf_counter()
        pending = []  # Steps' parameters not yet published, oldest first.

        def publish(array, token):
            token = array.share() if token is None else array.share(token=token)
            # Held until the token names another array: a share does not keep its array alive,
            # and a token naming a released array would fail the server's import.
            published[0] = array
            return token
        for _ in range(n):
            tokens, targets = next(stream)
            flat, loss = step(flat, tokens.reshape(shape), targets.reshape(shape))
            pending.append(flat)
            ready = [i for i, p in enumerate(pending) if p.is_ready()]
            if token is None or ready:
                token = publish(pending[ready[-1]] if ready else flat, token)
                del pending[:ready[-1] + 1 if ready else len(pending)]
        loss = float(loss)
        token = publish(flat, token)  # The last step's, now ready.
        return flat, token, loss, n * args.batch * c.seq / (time.perf_counter() - t0)

    published = [None]  # The array the token names.
    server = Server(args, c, unravel)
    log(f"trainer on devices {trainer.devices} (island {trainer.islands}); the server on "
        f"island 1 as tenant 'serve', share {args.serve_share}")
    try:
        return run(args, c, unravel, flat, train, server, log)
    finally:
        server.close()


def run(args, c, unravel, flat, train, server, log) -> int:
    """Training alone, then while serving; the final answer checked."""
    flat, token, loss, _ = train(1, flat, None)  # Compiles, and makes the token.
    server.ask(token, "warm up")  # Compiles the server's function.
    flat, token, loss, alone = train(args.steps, flat, token)
    log(f"{args.steps} steps alone: loss {loss:.4f}, {alone:.0f} tokens/s")

    latencies, stop, failed = [], threading.Event(), []
    prompts = ["The Software is ", "you may not use ", "under the terms ", "Copyright (C) "]

    def requester():
        i = 0
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                server.ask(token, prompts[i % len(prompts)])
                latencies.append((time.perf_counter() - t0) * 1e3)
                i += 1
        except Exception as e:  # noqa: BLE001 - reported below.
            failed.append(e)
    thread = threading.Thread(target=requester, daemon=True)
    thread.start()
    try:
        flat, token, loss, serving = train(args.steps, flat, token)
    finally:
        stop.set()
        thread.join(timeout=300)
    if failed:
        raise failed[0]
    p50, p99 = (np.percentile(latencies, [50, 99]) if latencies else (float("nan"),) * 2)
    log(f"{args.steps} steps while serving: loss {loss:.4f}, {serving:.0f} tokens/s "
        f"({serving / alone:.2f}x of alone); {len(latencies)} requests of {args.new_tokens} "
        f"bytes, latency p50 {p50:.1f} ms, p99 {p99:.1f} ms")

    final = server.ask(token, prompts[0])
    window = np.asarray(final["window"], np.int32)
    gap = check(c, unravel, np.asarray(flat), window, args.new_tokens)
    prompt_kept = bool(np.array_equal(window[:PROMPT], encode(prompts[0], c)[:PROMPT]))
    closed = server.close() == 0
    ok = gap <= TIE and prompt_kept and closed and len(latencies) > 0
    log(f"served with the final weights: {prompts[0]!r} -> {final['text']!r}; each byte the "
        f"reference's argmax (largest logit gap {gap:.1e}, ties within {TIE:.0e})"
        f"{'' if prompt_kept else ', but the prompt came back changed'}: "
        f"{'OK' if ok else 'MISMATCH'}")
    if args.json:
        print(json.dumps({"train_tokens_per_second_alone": alone,
                          "train_tokens_per_second_serving": serving,
                          "requests": len(latencies), "latency_ms_p50": float(p50),
                          "latency_ms_p99": float(p99), "new_tokens": args.new_tokens,
                          "serve_share": args.serve_share, "final_text": final["text"],
                          "logit_gap": gap, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
