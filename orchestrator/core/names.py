"""What a job's name may be: one rule for ``run.name``, ``sweep.name`` and the trials' names.

Letters, digits, '.', '_', '-', starting and ending with a letter or digit, at most 63 characters: a valid
Kubernetes label value, Slurm job name and storage prefix (Kubernetes object names derive from it).
"""

from __future__ import annotations

import re

RUN_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
