"""How a test worker ends: its failures (the first 40), a count line the tests look for, and
an exit status that fails the job when anything failed."""

import sys


def finish(rank, checks, failures):
    for f in failures[:40]:
        print("FAIL", f)
    print(f"rank {rank}: {checks - len(failures)} of {checks} checks passed")
    sys.exit(1 if failures else 0)
