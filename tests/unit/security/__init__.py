"""Attacks on XG (issue 26): forged engines, poisoned caches, hostile servers and sources, bombs."""
