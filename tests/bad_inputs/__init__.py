"""Malformed inputs for Gradian's commands: a corpus built into a temporary folder at test time."""
