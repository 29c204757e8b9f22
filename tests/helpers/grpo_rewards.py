"""Reward functions for the GRPO tests: each call appended to the file ``ORCH_TEST_REWARD_LOG`` names."""
from __future__ import annotations

import json
import os

from recipes.rewards import exact_answer, row_id, uncached


def logged_exact_answer(prompts, completions, answer=None, **kwargs):
    """``recipes.rewards:exact_answer``, with one line per scored (prompt, completion, answer) in the log file."""
    path = os.environ.get("ORCH_TEST_REWARD_LOG")
    if path:
        with open(path, "a") as fh:
            for prompt, completion, want in zip(prompts, completions, answer):
                fh.write(json.dumps([prompt, completion, want]) + "\n")
    return exact_answer(prompts, completions, answer=answer)


@uncached
def logged_prompts(prompts, completions, answer=None, trainer_state=None, **kwargs):
    """Adds nothing to the reward (0.0); appends the step and the prompt ids of every generation batch it is called
    on to the file ``ORCH_TEST_PROMPT_LOG`` names (uncached: it sees every batch, a regenerated one too)."""
    path = os.environ.get("ORCH_TEST_PROMPT_LOG")
    if path:
        with open(path, "a") as fh:
            ids = [row_id(p, {"answer": a}) for p, a in zip(prompts, answer)]
            fh.write(json.dumps([trainer_state.global_step, ids]) + "\n")
    return [0.0] * len(completions)


def no_kwargs(prompts, completions):
    return [0.0] * len(completions)


def needs_judge(prompts, completions, judge, **kwargs):
    return [0.0] * len(completions)


NOT_CALLABLE = 3
