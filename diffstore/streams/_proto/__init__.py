"""Generated from protos/hstream.proto by scripts/gen_protos.py; do not edit."""
