"""Content-addressed artifacts over the p2p network (issue 10 item 1; ADRs 0146-0147).

Files are cut into 1 MiB chunks; the artifact id is a Merkle root over them bound to the size
(``merkle``); a ``Manifest`` lists the leaf hashes and is checked against the id; an
``ArtifactStore`` keeps complete and partial artifacts on disk; ``ArtifactService`` (``node.artifacts``)
serves them on ``/dekube/artifact/1.0.0`` and fetches from several holders at once.
"""
from .errors import ArtifactError, ArtifactTooLarge, CorruptChunk
from .manifest import Manifest, ManifestError
from .merkle import CHUNK_SIZE, artifact_id, artifact_id_of_bytes, artifact_id_of_file, check_id
from .protocol import PROTOCOL
from .service import ArtifactLimits, ArtifactService, FetchReport
from .store import ArtifactStore

__all__ = ["CHUNK_SIZE", "PROTOCOL", "ArtifactError", "ArtifactLimits", "ArtifactTooLarge", "ArtifactService",
           "ArtifactStore", "CorruptChunk", "FetchReport", "Manifest", "ManifestError", "artifact_id",
           "artifact_id_of_bytes", "artifact_id_of_file", "check_id"]
