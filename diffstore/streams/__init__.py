"""HStream streams: the wire protocol (``_proto``), the embedded HStream-compatible server (``server``) and,
alongside, the client, producer, consumer and ingestion modules."""
