"""The dekube-node command line."""
