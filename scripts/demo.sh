#!/usr/bin/env bash
# The main job on embedded defaults: install, start a local 4-validator SDBFT testnet on 127.0.0.1,
# move funds with the wallet, and show that every validator agrees. No docker needed.
# Leaves the testnet running (stop it with: dekube-node testnet down --home ./testnet);
# pass --down to stop it at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
HOME_DIR=${DEKUBE_TESTNET_HOME:-./testnet}
dekube-node testnet up --validators 4 --home "$HOME_DIR"
RPC=$(python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print('http://127.0.0.1:%d' % m['nodes'][0]['rpc_port'])" "$HOME_DIR/testnet.json")
FAUCET="$HOME_DIR/faucet_key.json"
USER_HOME="$HOME_DIR/demo-user"
[ -f "$USER_HOME/node_key.json" ] || dekube-node keys new --home "$USER_HOME" >/dev/null
USER_ID=$(dekube-node keys show --home "$USER_HOME" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['peer_id'])")
echo "== sending 1000 tokens from the faucet to $USER_ID"
dekube-node wallet send --rpc "$RPC" --key "$FAUCET" "$USER_ID" 1000 --wait
echo "== balances"
dekube-node wallet balance --rpc "$RPC" --home "$USER_HOME"
dekube-node testnet status --home "$HOME_DIR"
if [ "${1:-}" = "--down" ]; then dekube-node testnet down --home "$HOME_DIR"; fi
