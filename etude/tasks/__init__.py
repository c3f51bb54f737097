"""Tasks from real repositories: the SWE-bench-compatible schema and loaders, mining from PyPI
release diffs, bug synthesis by CST mutation, validation in the sandbox, and the built-in suite.

See docs/tasks.md. Public surface (the contract in docs/contracts.md):
    load_tasks(path) -> list[Task]      save_tasks(tasks, path)
    prepare_repo(task) -> Path          task_env(task) -> Path
    builtin_suite(split="train"|"eval", max_tasks=None, *, use) -> list[Task]   (use: etude.tasks.seal.USES)
"""

from etude.tasks.repo import prepare_repo, task_env
from etude.tasks.schema import load_tasks, load_tasks_report, save_tasks, task_from_dict
from etude.tasks.suite import builtin_suite
from etude.types import Task

__all__ = [
    "Task",
    "load_tasks",
    "load_tasks_report",
    "save_tasks",
    "task_from_dict",
    "prepare_repo",
    "task_env",
    "builtin_suite",
]
