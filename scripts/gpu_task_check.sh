#!/usr/bin/env bash
# The CUDA path end to end (issue 10 item 7), for a machine with a GPU: a local devnet (1 validator,
# 4 compute nodes sharing the GPU) trains the user's CNN (examples/digits_cnn.py) as a task with
# --device cuda: the ledger assigns GPU nodes only, 3 workers train on the GPU with deterministic
# settings (docs/adr/0150), ledger-drawn verifiers on the same GPU profile replay drawn segments (audit
# slots, docs/adr/0168), the task is paid and the weights are fetched and evaluated. Prints the detected
# hardware, the task's device and profile, the slots' outcomes and payouts, and the accuracy before and after. Assumes scripts/install.sh has run.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${DEKUBE_GPU_CHECK_DIR:-$(mktemp -d /tmp/dekube-gpu-check.XXXXXX)}
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: nothing to check')"
python3 -c "import ml.hardware as h; print('hardware:', h.detect())"
python3 examples/digits_cnn.py prepare "$WORK/job" >/dev/null
dekube-node testnet up --home "$WORK/net" --validators 1 --compute 4 --json > "$WORK/net.json"
trap 'dekube-node testnet down --home "$WORK/net" >/dev/null 2>&1 || true' EXIT
RPC=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['validators'][0]['rpc'])" "$WORK/net.json")
echo "before: $(python3 examples/digits_cnn.py evaluate "$WORK/job" --json | tail -1)"
dekube-node task submit --rpc "$RPC" --key "$WORK/net/faucet_key.json" --model "$WORK/job/model.pt2" \
  --dataset "$WORK/job/train.npz" --eval "$WORK/job/test.npz" --loss cross_entropy --optimizer adamw --lr 3e-3 \
  --batch 64 --steps 150 --workers 3 --codec int8 --price 100000 --device cuda --wait --out "$WORK/job/trained" \
  --timeout 400
echo "after: $(python3 examples/digits_cnn.py evaluate "$WORK/job" --weights "$WORK/job/trained/weights.safetensors" --json | tail -1)"
TASK=$(dekube-node task list --rpc "$RPC" --json --limit 1 | python3 -c "import json,sys; print(json.load(sys.stdin)[0]['task_id'])")
dekube-node task show "$TASK" --rpc "$RPC"
