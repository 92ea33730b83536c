"""Backbone relays: circuit relay v2 hop/stop, relay client, DCUtR hole punching, usage receipts."""
