"""Content-addressed artifact cache: keys, local store, remote HTTP tier, gc, explain."""
