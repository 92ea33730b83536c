// Node 20 lacks Promise.withResolvers (Node 22+), which js-libp2p 3.x's dependencies (it-queue) use;
// loaded with `node --import ./node20.mjs` before the peer so that the pinned 3.x runs on Node 20.
if (typeof Promise.withResolvers !== 'function') {
  Promise.withResolvers = function withResolvers () {
    let resolve, reject
    const promise = new this((res, rej) => { resolve = res; reject = rej })
    return { promise, resolve, reject }
  }
}
