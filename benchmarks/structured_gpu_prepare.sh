#!/usr/bin/env bash
# Prepare, on a machine with the embedded model and PyPI, what `specdec bench structured --random-8b`
# needs on a GPU machine without network: the embedded model's tokenizer files and the wheels of
# llguidance and jsonschema (for CPython 3.10-3.13, x86_64 Linux), under .whl/structured-gpu/ (ignored by
# git; pass it to the device call as a carried path). Then, on the GPU machine:
#   pip install -q --no-index --find-links .whl/structured-gpu/wheels llguidance jsonschema
#   PYTHONPATH=src python3 -m specdec.cli bench structured --random-8b --tokenizer .whl/structured-gpu/tokenizer \
#       --tasks 8 --max-new-tokens 64 --out-dir "$OUT" --no-scoreboard
set -euo pipefail
out=.whl/structured-gpu
python=${PYTHON:-python3}
mkdir -p "$out/tokenizer" "$out/wheels"
dir=$(PYTHONPATH=src "$python" -c "from specdec.models import default; print(default.prepared_dir())")
cp "$dir"/tokenizer.json "$dir"/tokenizer_config.json "$dir"/chat_template.jinja "$out/tokenizer/"
for version in 3.10 3.11 3.12 3.13; do
    "$python" -m pip download -q --only-binary=:all: --python-version "$version" \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_34_x86_64 \
        -d "$out/wheels" llguidance jsonschema
done
du -sh "$out"
