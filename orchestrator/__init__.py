"""Experiment orchestrator for resumable post-training on preemptible GPUs."""

__version__ = "0.1.0"
