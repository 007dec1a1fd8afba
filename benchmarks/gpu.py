"""Run the GPU benchmark without installing specdec: `python benchmarks/gpu.py [--smoke] [--cpu]`.

Same as `specdec bench gpu`; see src/specdec/bench/gpu.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from specdec.bench.gpu import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
