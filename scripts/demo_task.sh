#!/usr/bin/env bash
# The task flow on embedded defaults: a local devnet of 2 validators + 4 compute nodes on 127.0.0.1,
# a digits MLP task for 3 workers with an int8 all-reduce over the nodes' p2p stack; waits until it
# is trained and committed, its audit slots (docs/adr/0168: ledger-drawn verifiers replay a drawn
# segment of each worker and answer with evidence) resolve, it is paid; prints the slots and payouts.
# Stops every process at the end (pass --keep to leave the devnet running; stop it later with
# dekube-node testnet down --home DIR). Assumes scripts/install.sh has run (dekube-node on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
HOME_DIR=${DEKUBE_DEMO_HOME:-$(mktemp -d /tmp/dekube-task-demo.XXXXXX)}
STEPS=${DEKUBE_DEMO_STEPS:-100}
if [ "${1:-}" != "--keep" ]; then
  trap 'dekube-node testnet down --home "$HOME_DIR" >/dev/null 2>&1 || true' EXIT
fi
echo "== devnet in $HOME_DIR"
dekube-node testnet up --home "$HOME_DIR" --validators 2 --compute 4
RPC=$(python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print('http://127.0.0.1:%d' % m['nodes'][0]['rpc_port'])" "$HOME_DIR/testnet.json")
echo "== submitting a task: mlp on digits, 3 workers, int8, $STEPS steps, price 100000"
dekube-node task submit --rpc "$RPC" --key "$HOME_DIR/faucet_key.json" --model mlp --dataset digits \
  --workers 3 --codec int8 --steps "$STEPS" --price 100000 --wait --timeout 600
echo "== what each compute node reports (dkb_computeStatus)"
python3 - "$HOME_DIR" <<'PY'
import json, sys
from node.ledger import jsonrpc
for node in json.load(open(sys.argv[1] + "/compute.json")):
    status = jsonrpc.call(f"http://127.0.0.1:{node['rpc_port']}", "dkb_computeStatus")
    for task_id, job in status["jobs"].items():
        print(f"  {node['name']} worker  task {task_id[:12]}..  {job['state']}  step {job['step']}  "
              f"sent {job['bytes_sent'] / 1e6:.2f} MB  {job.get('metrics')}")
    for task_id, duties in status["audits"].items():   # the audit answers and referee votes it sent
        for d in duties:
            print(f"  {node['name']} {d['kind']:8} task {task_id[:12]}..  slot {d['slot']}: {d['worker'][:12]}.. "
                  f"segment {d['segment']} {'match' if d['match'] else 'MISMATCH'}")
PY
echo "== tasks"
dekube-node task list --rpc "$RPC"
python3 -c "import sys; from node.ledger import jsonrpc; s = jsonrpc.call(sys.argv[1], 'dkb_getSupply'); print('supply', s['total'], 'genesis', s['genesis'], 'conserved' if s['total'] == s['genesis'] else 'NOT CONSERVED')" "$RPC"
