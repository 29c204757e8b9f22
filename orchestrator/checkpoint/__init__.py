"""Checkpoints of the full training state in object storage.

``manifest``: what a committed checkpoint is (files, sizes, SHA-256, fingerprints).
``store``: commit in the background (data first, manifest last), retention, verified restore.
``callback``: the Trainer callback that decides when to save and hands the Trainer's own
checkpoint folder to the committer.
"""
