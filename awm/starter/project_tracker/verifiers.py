"""Verifiers."""
