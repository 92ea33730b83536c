"""Developer tooling: simulators and harnesses that are not part of the node."""
