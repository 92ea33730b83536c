"""Developer tooling: simulators, load generators and local test networks (not imported by the node)."""
