"""The minimal speculative-decoding engine (built on specops.ops only)."""
