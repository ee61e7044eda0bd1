"""Helpers that start carpool's real processes for tests."""
