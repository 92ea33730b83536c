#!/usr/bin/env bash
# The main job: a user's own model and data, trained on the devnet. Writes a small CNN over
# scikit-learn's 8x8 digit images (defined in examples/digits_cnn.py, exported with torch.export to
# model.pt2, not from dekube's registry) and its data (train.npz, test.npz), evaluates the untrained
# model, submits the files as a paid task for 3 workers (dry run first; the files are served from
# this machine until a worker holds them) with live progress, fetches the trained weights (checked
# against the ledger's result), evaluates them locally and prints the accuracy before and after.
# Needs a running devnet in $DEKUBE_DEMO_HOME (dekube-node testnet up --home DIR --compute 4), or
# starts one there; assumes scripts/install.sh has run.
set -euo pipefail
cd "$(dirname "$0")/.."
HOME_DIR=${DEKUBE_DEMO_HOME:-./devnet}
STEPS=${DEKUBE_DEMO_STEPS:-150}
JOB="$HOME_DIR/user-job"
dekube-node testnet up --home "$HOME_DIR" --validators 2 --compute 4 >/dev/null
RPC=$(python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print('http://127.0.0.1:%d' % m['nodes'][0]['rpc_port'])" "$HOME_DIR/testnet.json")
echo "== your model and data: a CNN over 8x8 digits (examples/digits_cnn.py) in $JOB"
python3 examples/digits_cnn.py prepare "$JOB"
BEFORE=$(python3 examples/digits_cnn.py evaluate "$JOB" --json)
python3 examples/digits_cnn.py evaluate "$JOB"
rm -rf "$JOB/trained"
echo "== submitting model.pt2 + train.npz (eval on test.npz): 3 workers, int8, $STEPS steps, price 100000"
dekube-node task submit --rpc "$RPC" --key "$HOME_DIR/faucet_key.json" \
  --model "$JOB/model.pt2" --dataset "$JOB/train.npz" --eval "$JOB/test.npz" \
  --loss cross_entropy --optimizer adamw --lr 3e-3 --batch 64 --steps "$STEPS" --workers 3 --codec int8 \
  --price 100000 --wait --out "$JOB/trained" --timeout 600
echo "== evaluating the fetched weights locally"
AFTER=$(python3 examples/digits_cnn.py evaluate "$JOB" --weights "$JOB/trained/weights.safetensors" --json)
python3 - "$BEFORE" "$AFTER" "$JOB/trained/metrics.json" <<'PY'
import json, sys
before, after = json.loads(sys.argv[1]), json.loads(sys.argv[2])
workers = json.load(open(sys.argv[3])).get("final", {}).get("metrics", {})
print(f"accuracy on the {after['examples']} held-out digits: before {before['accuracy']:.2f}%  "
      f"after {after['accuracy']:.2f}%  (the workers reported {workers or 'no metrics'})")
PY
