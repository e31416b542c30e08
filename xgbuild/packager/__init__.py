"""The `.xge` engine format: deterministic writer, reader and verification."""
