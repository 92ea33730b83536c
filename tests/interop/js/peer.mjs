// A js-libp2p peer for tests/interop/test_js_libp2p.py: TCP + noise + yamux, identify, ping,
// circuit relay v2 (client, and server in "relay" mode) and DCUtR, with the package versions
// pinned in package.json. It prints one line per event on stdout and takes commands on stdin.
//
// Usage: node peer.mjs MODE LISTEN_IP [RELAY_MADDR]; with JS_PEER_PORT set, it listens on that port
//   and announces LISTEN_IP:port as verified (js-libp2p only announces a public listen address that
//   something confirmed, and its DCUtR ignores private ones).
//   relay   a circuit relay v2 server with js-libp2p's default limits (2 min, 128 KiB)
//   target  reserve on RELAY_MADDR and serve; prints "RESERVED <circuit addr>"
// Lines out: "ADDR <maddr>", "RESERVED <maddr>", "CONN <id> <direction> <remoteAddr> <limits JSON>",
//   "CLOSE <id> <remoteAddr>", "PING <rtt ms>" / "PINGERR <message>", "DIRECT <remoteAddr>".
// Lines in: "ping <peer id>" (on whatever connection libp2p picks), "dial <maddr>".
import { createInterface } from 'node:readline'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { circuitRelayServer, circuitRelayTransport } from '@libp2p/circuit-relay-v2'
import { dcutr } from '@libp2p/dcutr'
import { identify } from '@libp2p/identify'
import { ping } from '@libp2p/ping'
import { tcp } from '@libp2p/tcp'
import { peerIdFromString } from '@libp2p/peer-id'
import { multiaddr } from '@multiformats/multiaddr'
import { createLibp2p } from 'libp2p'

const [mode, listenIp, relayAddr] = process.argv.slice(2)
const out = (line) => process.stdout.write(line + '\n')
const limitsJson = (limits) => JSON.stringify(limits == null
  ? null
  : { seconds: limits.seconds ?? null, bytes: limits.bytes == null ? null : Number(limits.bytes) })

const services = { identify: identify(), ping: ping(), dcutr: dcutr() }
if (mode === 'relay') services.relay = circuitRelayServer()
const port = Number(process.env.JS_PEER_PORT ?? 0)
const listen = [`/ip4/${listenIp}/tcp/${port}`]
const appendAnnounce = port === 0 ? [] : [`/ip4/${listenIp}/tcp/${port}`]
if (mode === 'target') listen.push(`${relayAddr}/p2p-circuit`)

const node = await createLibp2p({
  addresses: { listen, appendAnnounce },
  transports: [tcp(), circuitRelayTransport()],
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  connectionGater: { denyDialMultiaddr: () => false }, // loopback / test addresses are fine here
  services
})

node.addEventListener('connection:open', (evt) => {
  const c = evt.detail
  out(`CONN ${c.id} ${c.direction} ${c.remoteAddr.toString()} ${limitsJson(c.limits)}`)
})
node.addEventListener('connection:close', (evt) => out(`CLOSE ${evt.detail.id} ${evt.detail.remoteAddr.toString()}`))

const tcpAddr = node.getMultiaddrs().find((a) => !a.toString().includes('/p2p-circuit'))
out(`ADDR ${tcpAddr.toString()}`)

if (mode === 'target') {
  const circuit = () => node.getMultiaddrs().find((a) => a.toString().includes('/p2p-circuit'))
  while (circuit() == null) await new Promise((resolve) => setTimeout(resolve, 50))
  out(`RESERVED ${circuit().toString()}`)
}

for await (const line of createInterface({ input: process.stdin })) {
  const [cmd, arg] = line.trim().split(/\s+/)
  try {
    if (cmd === 'ping') out(`PING ${await node.services.ping.ping(peerIdFromString(arg))}`)
    else if (cmd === 'dial') {
      const c = await node.dial(multiaddr(arg))
      out(`DIALED ${c.remoteAddr.toString()} ${limitsJson(c.limits)}`)
    }
  } catch (err) {
    out(`ERR ${cmd} ${String(err?.message ?? err).replace(/\s+/g, ' ')}`)
  }
}
await node.stop()
