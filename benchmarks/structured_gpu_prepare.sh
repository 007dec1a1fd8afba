#!/usr/bin/env bash
# Prepare, on a machine with the embedded model and PyPI, what `specdec bench structured --random-8b`
# needs on a GPU machine without network: the embedded model's tokenizer files and the wheels of
# llguidance and jsonschema with the dependencies the GPU image lacks (jsonschema-specifications,
# referencing, rpds-py; attrs and typing-extensions are there), for the GPU image's CPython 3.12,
# x86_64 Linux, at the versions this checkout's venv runs. They go under .whl/structured-gpu/ (ignored
# by git); carry that folder in the device call. Then, on the GPU machine (docs/structured.md):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
#       .whl/structured-gpu/wheels/*.whl
#   PYTHONPATH=src:/tmp/site python3 -m specdec.cli bench structured --random-8b \
#       --tokenizer .whl/structured-gpu/tokenizer --tasks 8 --max-new-tokens 64 --out-dir "$OUT" --no-scoreboard
# PYTHON: the interpreter that holds specdec's dependencies here (default: python3); PY_VERSION: the
# GPU machine's Python (default 3.12).
set -euo pipefail
out=.whl/structured-gpu
python=${PYTHON:-python3}
py_version=${PY_VERSION:-3.12}
packages=(llguidance jsonschema jsonschema-specifications referencing rpds-py)
rm -rf "$out"
mkdir -p "$out/tokenizer" "$out/wheels"
dir=$(PYTHONPATH=src "$python" -c "from specdec.models import default; print(default.prepared_dir())")
cp "$dir"/tokenizer.json "$dir"/tokenizer_config.json "$dir"/chat_template.jinja "$out/tokenizer/"
pinned=()
for name in "${packages[@]}"; do  # the versions the tests here ran with
    version=$("$python" -c "import importlib.metadata as m; print(m.version('$name'))")
    pinned+=("$name==$version")
done
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$py_version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$out/wheels" "${pinned[@]}"
ls "$out/wheels"
du -sh "$out"
