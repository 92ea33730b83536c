"""ML runtime: gradient codecs, compressed all-reduce, trainers, model and dataset registry."""
