"""The long fuzzing run: every parser of untrusted bytes (tests/fuzz_targets.py), at least
100,000 inputs each, deterministic for a given --seed.

    nice python bench/fuzz.py [--inputs 100000] [--seed 1] [--hang-secs 2] [--target NAME ...]

Inputs are random bytes (1 in 10) and mutations (tests/fuzz_targets.py: mutate) of a
corpus that starts from the valid seeds and keeps, up to 512 entries, mutants the parser
accepted: so the run reaches past the first check of each parser. A crash is an exception
a parser may not raise or twins that disagree; a hang is one input running longer than
--hang-secs. Prints one line per target and exits 1 on any crash or hang.
"""
from __future__ import annotations

import argparse
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fuzz_targets import SEEDS, TARGETS, Finding, mutate  # noqa: E402

CORPUS_MAX = 512


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def accepted(outcome: object) -> bool:
    if outcome is None or isinstance(outcome, Exception):
        return False
    return not (isinstance(outcome, tuple) and outcome and outcome[0] == "error")


def run_target(name: str, inputs: int, seed: int, hang_secs: float) -> dict:
    rng = random.Random(f"{seed}:{name}")
    target = TARGETS[name]
    corpus = list(SEEDS[name])
    crashes: list[str] = []
    hangs: list[str] = []
    accepted_count = 0
    start = time.monotonic()
    for _ in range(inputs):
        if rng.random() < 0.1:
            data = rng.randbytes(rng.randint(0, 512))
        else:
            data = mutate(rng.choice(corpus), rng)
        signal.setitimer(signal.ITIMER_REAL, hang_secs)
        try:
            outcome = target(data)
        except Finding as e:
            crashes.append(str(e))
            continue
        except Hang:
            hangs.append(data[:256].hex())
            continue
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if accepted(outcome):
            accepted_count += 1
            if len(corpus) < CORPUS_MAX:
                corpus.append(data)
            else:
                corpus[rng.randrange(len(SEEDS[name]), CORPUS_MAX)] = data
    return {"target": name, "inputs": inputs, "accepted": accepted_count, "crashes": crashes, "hangs": hangs,
            "seconds": time.monotonic() - start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs per target (default 100000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hang-secs", type=float, default=2.0, help="one input longer than this is a hang")
    parser.add_argument("--target", action="append", choices=sorted(TARGETS), help="only these (repeatable)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGALRM, _alarm)
    bad = 0
    print(f"{'target':<14} {'inputs':>8} {'accepted':>9} {'crashes':>8} {'hangs':>6} {'seconds':>8}")
    for name in args.target or sorted(TARGETS):
        r = run_target(name, args.inputs, args.seed, args.hang_secs)
        print(f"{name:<14} {r['inputs']:>8} {r['accepted']:>9} {len(r['crashes']):>8} {len(r['hangs']):>6} "
              f"{r['seconds']:>8.1f}", flush=True)
        for line in r["crashes"][:5] + [f"hang: {h}" for h in r["hangs"][:5]]:
            print(f"    {line[:600]}")
        bad += len(r["crashes"]) + len(r["hangs"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
