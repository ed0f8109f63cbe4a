"""HStream streams: the wire protocol (``_proto``), the embedded HStream-compatible server (``server``) and,
alongside, the client, producer, consumer and ingestion modules.

This package's own module imports nothing: the command line builds the parsers of the streams commands
from it (the default port) where the 'streams' extra (grpcio, protobuf) is not installed, so that their
``--help`` works everywhere and running one says what to install.
"""

DEFAULT_PORT = 6570
"""HStreamDB's port, the default of ``hstream://`` URLs and of ``diffstore streams serve``."""
