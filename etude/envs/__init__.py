"""Environments: an episode is a task + a fresh workspace + a harness run; grading applies the
agent's diff to a second clean workspace with the task's own tests restored (docs/tasks.md).

    from etude.envs import run_episode, grade_patch
    traj, outcome = run_episode(task, policy, harness_config)
    outcome = grade_patch(task, patch_text)
"""

from etude.envs.episode import run_episode
from etude.envs.grade import Grading, grade, grade_patch, strip_protected

__all__ = ["Grading", "grade", "grade_patch", "run_episode", "strip_protected"]
