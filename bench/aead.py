"""ChaCha20-Poly1305 seal/open throughput at transport frame sizes, single core, CPU time.

Measures node.p2p.chachapoly.ChaChaPoly (seal_into/open_into, as the noise transport calls them:
memoryview slices of one buffer, no copies) and, with ``--old PATH``, every backend of an older
chachapoly.py loaded from PATH, interleaved in the same run (rounds alternate, the median of the
rounds counts), so a loaded machine slows all of them alike.

Prints one JSON object: {"<cipher>": {"seal_MBps": .., "open_MBps": ..}, ...} (MB = 10^6 bytes).
Usage: python bench/aead.py [--frame 65519] [--mib 64] [--rounds 5] [--old /path/to/old/chachapoly.py]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node.p2p.chachapoly import ChaChaPoly  # noqa: E402

TAG = 16


def load_old(path: str) -> dict:
    spec = importlib.util.spec_from_file_location("old_chachapoly", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {f"old-{name}": (lambda key, cls=cls: cls(key)) for name, cls in module.BACKENDS.items()}


def run_round(cipher, frame: int, frames: int) -> tuple[float, float]:
    """CPU seconds to seal, then open, ``frames`` frames of ``frame`` bytes."""
    plain = os.urandom(frame * frames)
    sealed = bytearray((frame + TAG) * frames)
    opened = bytearray(frame * frames)
    nonce = bytes(12)
    with memoryview(plain) as src, memoryview(sealed) as mid, memoryview(opened) as dst:
        start = time.process_time()
        for i in range(frames):
            cipher.seal_into(nonce, src[i * frame:(i + 1) * frame], mid[i * (frame + TAG):(i + 1) * (frame + TAG)])
        sealed_s = time.process_time() - start
        start = time.process_time()
        for i in range(frames):
            cipher.open_into(nonce, mid[i * (frame + TAG):(i + 1) * (frame + TAG)], dst[i * frame:(i + 1) * frame])
        opened_s = time.process_time() - start
    assert opened == plain
    return sealed_s, opened_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frame", type=int, default=65535 - TAG, help="plaintext bytes per frame (noise maximum)")
    parser.add_argument("--mib", type=int, default=64, help="MiB per round and cipher")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--old", help="an older chachapoly.py to compare against")
    args = parser.parse_args()
    makers = {"new": ChaChaPoly}
    if args.old:
        makers.update(load_old(args.old))
    key = os.urandom(32)
    ciphers = {name: make(key) for name, make in makers.items()}
    frames = max(1, args.mib * 2**20 // args.frame)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in ciphers}
    for _ in range(args.rounds):
        for name, cipher in ciphers.items():
            times[name].append(run_round(cipher, args.frame, frames))
    nbytes = args.frame * frames
    result = {name: {"seal_MBps": round(nbytes / statistics.median(t[0] for t in rounds) / 1e6),
                     "open_MBps": round(nbytes / statistics.median(t[1] for t in rounds) / 1e6)}
              for name, rounds in times.items()}
    result["frame_bytes"] = args.frame
    print(json.dumps(result))


if __name__ == "__main__":
    main()
