#!/usr/bin/env bash
# The main job on embedded defaults, no docker: installs, starts a local network on 127.0.0.1
# (2 SDBFT validators + 4 compute nodes), then a user's job (scripts/demo_user_task.sh): a CNN of
# its own over scikit-learn's 8x8 digits exported to model.pt2 with its data files, submitted as a
# paid task for 3 workers with live progress, the trained weights fetched, checked against the
# ledger and evaluated locally (accuracy before and after). Second part, the built-in registry task
# (scripts/demo_task.sh: a digits MLP, its audit slots replayed, paid, with the payouts), then funds
# moved with the wallet. Leaves the network running in ./devnet (stop it with
#   dekube-node testnet down --home ./devnet); pass --down to stop it at the end.
# Then, where it can (root, network namespaces), a task across NAT: validators and relays on
# emulated public hosts, the compute nodes each behind its own NAT router (devtools/netlab/demo_nat.py);
# pass --no-nat to skip that part.
set -euo pipefail
cd "$(dirname "$0")/.."
DOWN=0; NAT=1
for arg in "$@"; do
  case "$arg" in --down) DOWN=1 ;; --no-nat) NAT=0 ;; esac
done
bash scripts/install.sh
export DEKUBE_DEMO_HOME=${DEKUBE_DEMO_HOME:-./devnet}
if [ "$DOWN" = 1 ]; then   # also when a step fails
  trap 'dekube-node testnet down --home "$DEKUBE_DEMO_HOME" >/dev/null 2>&1 || true' EXIT
fi
echo "== devnet in $DEKUBE_DEMO_HOME"
dekube-node testnet up --home "$DEKUBE_DEMO_HOME" --validators 2 --compute 4
bash scripts/demo_user_task.sh
echo "== second part: a task naming a registry model (digits-mlp)"
bash scripts/demo_task.sh --keep
RPC=$(python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print('http://127.0.0.1:%d' % m['nodes'][0]['rpc_port'])" "$DEKUBE_DEMO_HOME/testnet.json")
USER_HOME="$DEKUBE_DEMO_HOME/demo-user"
[ -f "$USER_HOME/node_key.json" ] || dekube-node keys new --home "$USER_HOME" --insecure-unencrypted-key >/dev/null
USER_ID=$(dekube-node keys show --home "$USER_HOME" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['peer_id'])")
echo "== wallet: sending 1000 tokens from the faucet to $USER_ID"
dekube-node wallet send --rpc "$RPC" --key "$DEKUBE_DEMO_HOME/faucet_key.json" "$USER_ID" 1000 --wait
dekube-node wallet balance --rpc "$RPC" --home "$USER_HOME"
if [ "$NAT" = 1 ]; then
  if [ "$(id -u)" = 0 ] && ! command -v nft >/dev/null && command -v apt-get >/dev/null; then
    apt-get install -y -qq nftables iproute2 >/dev/null 2>&1 || true
  fi
  echo "== the same task across NAT (emulated internet in network namespaces)"
  python3 -m devtools.netlab.demo_nat || [ $? = 2 ]   # 2: this machine cannot build namespaces (said why)
fi
if [ "$DOWN" = 1 ]; then
  echo "== stopping the network"
else
  echo "== the network keeps running; stop it with: dekube-node testnet down --home $DEKUBE_DEMO_HOME"
fi
