"""Coverage-guided fuzzing (atheris/libFuzzer) of every decoder that reads a peer's or a client's bytes.

``targets`` names each decoder with its contract (the error classes it may raise) and valid seed
encodings; ``runner`` runs a target in a child process under libFuzzer with the decoder's packages
instrumented, keeps a corpus in ``fuzz/corpus/<target>/`` and writes reproducers to ``fuzz/crashes/``.
Usage: ``python -m devtools.fuzz TARGET --runs N`` or ``python -m devtools.fuzz --all --runs N --jobs J``
(docs/adr/0162). Dev tooling only: no product package imports it.
"""
