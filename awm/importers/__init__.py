"""Importers: turn environments published in other formats into awm bundles."""
