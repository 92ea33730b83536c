"""Errors of the artifact package."""
from __future__ import annotations


class ArtifactError(Exception):
    """An artifact cannot be added, found or fetched; the message says why."""


class ArtifactTooLarge(ArtifactError):
    """The artifact's manifest names more bytes than the fetch allows (nothing was downloaded)."""


class CorruptChunk(ArtifactError):
    """A chunk on disk does not match its leaf hash (the store demoted the artifact to partial)."""
