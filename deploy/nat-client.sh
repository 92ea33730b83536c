#!/bin/sh
# Entry point of a container behind a NAT router: route everything through ROUTER_IP, then run the
# command as the unprivileged dekube user. The container starts as root with NET_ADMIN only for this.
#   dekube-nat-client ROUTER_IP COMMAND [ARGS...]
set -eu
ROUTER_IP="$1"; shift
ip route replace default via "$ROUTER_IP"
exec setpriv --reuid=dekube --regid=dekube --init-groups --inh-caps=-all --bounding-set=-all "$@"
