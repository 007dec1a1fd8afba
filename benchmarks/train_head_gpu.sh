#!/usr/bin/env bash
# How the shipped SmolLM2-135M draft head was trained, on this sandbox's GPU machine (one H200).
#
# The split below is only a workaround of the sandbox: its GPU machine has no network, no model
# weights and no `gguf` package, one call carries at most 64 MiB and runs at most 10 minutes, and
# files there live only while the machine stays warm between calls. So the 98 MB GGUF of the
# embedded target travels in two halves in two back-to-back calls. Anywhere else, run directly:
#   pip install --no-deps -e . && python benchmarks/train_head_gpu.py --target default --out head.safetensors --data-dir data
#
# Here, once (repo root; .gl/ is ignored):
#   split -n 2 -d "$(python -c 'from specdec.models.default import gguf_path; print(gguf_path())')" .gl/part_
#   mv .gl/part_00 .gl/part_a; mv .gl/part_01 .gl/part_b
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .gl/whl gguf==0.19.0
# Call 1 (carry .gl/part_a and .gl/whl):         bash benchmarks/train_head_gpu.sh stage
# Call 2 (carry .gl/part_b), right after call 1:  bash benchmarks/train_head_gpu.sh train [driver options]
# A third call on the still-warm machine finds the GGUF and the data there: with `--data-only` in call 2
# and `--gen-seconds 0` in call 3, one call makes the data and the next trains on it for all of its time.
# The shipped head (docs/draft-head.md): call 2 `train --data-only --prompts 8192 --source-texts 3072
#   --followups 3072 --question-lists 2048 --gen-seconds 470 --draft-vocab 16384 --max-len 1024
#   --feature-layers 2,15,27`; call 3 `TRAIN_SECONDS=540 ... train --gen-seconds 0 (the same data options)
#   --steps 10000`, cut at TRAIN_SECONDS, which exports its last checkpoint; call 4 the same plus --resume.
set -uo pipefail
KEEP=/root/keep
GGUF=$KEEP/SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
case "${1:-}" in
stage)
  mkdir -p $KEEP && cp .gl/part_a $KEEP/ && cp -r .gl/whl $KEEP/ && ls -l $KEEP && nvidia-smi -L ;;
train)
  [ -f $GGUF ] || cat $KEEP/part_a .gl/part_b > $GGUF
  echo "$SHA  $GGUF" | sha256sum -c || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $KEEP/whl/*.whl || exit 1
  # specdec from this checkout (the repository root), gguf from the carried wheel
  export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  # The layers an earlier call's A/B (--ab-steps) chose, unless the options name them.
  WINNER=()
  if [ -f $KEEP/data/winner.txt ] && [[ " $* " != *" --head-layers "* ]]; then
    WINNER=(--head-layers "$(cat $KEEP/data/winner.txt)")
  fi
  # TRAIN_SECONDS: stop (and export the checkpoint below) before the call's own limit.
  # An EAGLE-3 head (--arch eagle3) is a checkpoint directory, a specdec head one file.
  HEAD=$KEEP/head.safetensors
  if [[ " $* " == *" --arch eagle3 "* ]]; then HEAD=$KEEP/head-eagle3; fi
  timeout "${TRAIN_SECONDS:-545}" python3 benchmarks/train_head_gpu.py --target $GGUF --out $HEAD \
    --data-dir $KEEP/data --summary $OUT/summary.json "${WINNER[@]}" "${@:2}" 2>&1 | tee $OUT/train.log
  cp $KEEP/data/ab.json $OUT/ 2>/dev/null
  if [ -e $HEAD ]; then cp -r $HEAD $OUT/; exit 0; fi
  [ -f $HEAD.ckpt ] || exit 0  # a data-only run
  # Cut short: export the last checkpoint's head (trained with a learning rate not yet decayed).
  python3 - "$HEAD.ckpt" "$OUT/$(basename $HEAD)-ckpt" <<'PY'
import sys, torch
from specdec.drafters.eagle3 import Eagle3Head
from specdec.drafters.head import DraftHead, HeadConfig
state = torch.load(sys.argv[1], weights_only=False, map_location="cpu")
config = HeadConfig(**state["head_config"])
head = (Eagle3Head if config.arch == "eagle3" else DraftHead)(config, state["head"]["vocab_ids"])
head.load_state_dict(state["head"])
head.save(sys.argv[2], meta={"step": state["step"], "history": state["history"]})
print("exported the checkpoint of step", state["step"])
PY
  ;;
*) echo "usage: $0 stage|train [options of train_head_gpu.py]"; exit 2 ;;
esac
