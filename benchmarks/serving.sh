#!/usr/bin/env bash
# The serving benchmark of issue 26 (benchmarks/serving.py says what it runs):
#   bash benchmarks/serving.sh              # H200: results under $OUT
#   bash benchmarks/serving.sh --smoke      # the tiny CPU version, here (also what runs without a GPU)
#   bash benchmarks/serving.sh --cpu        # the embedded model on this CPU (the README's table)
# Wheels carried in .whl/ (FastAPI, uvicorn, pydantic: the GPU image lacks them) go to /tmp/site first,
# where the Python at hand cannot import them already.
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null && ! python3 -c "import fastapi, uvicorn" 2> /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:src
else
    export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
fi
# The driver stops its servers on exit, on SIGTERM and at its own deadline (--deadline-s, 540 s unless
# given); the outer timeout is the last resort, a minute past that deadline, should the driver itself hang.
deadline=540
args=("$@")
for i in "${!args[@]}"; do
    case "${args[$i]}" in
        --deadline-s) deadline="${args[$((i + 1))]:-540}" ;;
        --deadline-s=*) deadline="${args[$i]#--deadline-s=}" ;;
    esac
done
exec timeout --kill-after=20 $(( ${deadline%.*} + 60 )) python3 benchmarks/serving.py --out "${OUT:-results/gpu-serving}" "$@"
