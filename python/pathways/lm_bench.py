"""pw bench lm: the Transformer LM of examples/lm in its three layouts (SPMD, data x model
parallel, on one island; a GPipe pipeline on one island; the pipeline over two islands), same
run, as one JSON object.

It runs examples/lm/train.py with --json (see its docstring for what each figure means): the
cluster is PW_CLUSTER's (or --cluster's), else an embedded one of PW_ISLANDS x
PW_HOSTS_PER_ISLAND x PW_DEVICES_PER_HOST (default 2 x 2 x 2, `pw up`'s shape).
"""
from __future__ import annotations

import os
import pathlib
import sys

LM_DIR = pathlib.Path(__file__).resolve().parents[2] / "examples" / "lm"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--cluster" in argv:  # The client commands' spelling of PW_CLUSTER.
        i = argv.index("--cluster")
        if i + 1 >= len(argv):
            print("pw bench lm: --cluster needs an address", file=sys.stderr)
            return 2
        os.environ["PW_CLUSTER"] = argv[i + 1]
        del argv[i:i + 2]
    for name, default in (("PW_ISLANDS", "2"), ("PW_HOSTS_PER_ISLAND", "2"),
                          ("PW_DEVICES_PER_HOST", "2")):
        os.environ.setdefault(name, default)
    if not (LM_DIR / "train.py").is_file():
        print(f"pw bench lm: no {LM_DIR / 'train.py'} (it runs from the pathways source tree)",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(LM_DIR))
    import train  # noqa: E402 - examples/lm/train.py
    return train.main(["--json"] + [a for a in argv if a != "--json"])


if __name__ == "__main__":
    sys.exit(main())
