#!/bin/sh
# NAT router of the compose testnet: masquerades the private network behind the address this
# container has on the backbone and lets no connection in (only replies to ones made from inside).
#   BACKBONE_IP: this router's address on the backbone network (finds the outside interface)
# Needs NET_ADMIN and net.ipv4.ip_forward=1 (the compose file sets both). Runs until stopped.
set -eu
: "${BACKBONE_IP:?set BACKBONE_IP to the router's backbone address}"
OUT=$(ip -o -4 addr show | awk -v ip="$BACKBONE_IP" '{split($4, a, "/"); if (a[1] == ip) print $2}')
[ -n "$OUT" ] || { echo "nat-router: no interface holds $BACKBONE_IP" >&2; exit 1; }
nft -f - <<NFT
table ip nat {
  chain postrouting { type nat hook postrouting priority srcnat; oifname "$OUT" masquerade; }
}
table inet filter {
  chain forward {
    type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname != "$OUT" oifname "$OUT" accept
  }
  chain input {
    type filter hook input priority filter; policy drop;
    ct state established,related accept
    iifname "lo" accept
    iifname != "$OUT" accept
  }
}
NFT
echo "nat-router: masquerading out of $OUT ($BACKBONE_IP); nothing comes in" >&2
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
