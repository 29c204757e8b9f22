"""Reward functions for the GRPO tests: each call appended to the file ``ORCH_TEST_REWARD_LOG`` names."""
from __future__ import annotations

import json
import os

from recipes.rewards import exact_answer


def logged_exact_answer(prompts, completions, answer=None, **kwargs):
    """``recipes.rewards:exact_answer``, with one line per scored (prompt, completion) in the log file."""
    path = os.environ.get("ORCH_TEST_REWARD_LOG")
    if path:
        with open(path, "a") as fh:
            for prompt, completion in zip(prompts, completions):
                fh.write(json.dumps([prompt, completion]) + "\n")
    return exact_answer(prompts, completions, answer=answer)


def no_kwargs(prompts, completions):
    return [0.0] * len(completions)


def needs_judge(prompts, completions, judge, **kwargs):
    return [0.0] * len(completions)


NOT_CALLABLE = 3
