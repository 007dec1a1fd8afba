"""`python -m tests.serve_with_fault FAULT serve ...`: `specdec serve` with one of specdec.faults' bugs in
place (FAULT `none`: the correct server). Only the test harness starts servers this way; no user-facing
option turns a fault on."""

import sys

from specdec import faults
from specdec.cli import main

if __name__ == "__main__":
    fault = sys.argv[1]
    with faults.inject(None if fault == "none" else fault):
        sys.exit(main(sys.argv[2:]))
