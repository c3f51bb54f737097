"""Real-sdist task fixtures, shared with the other task-building folder (see tests/task_fixtures.py)."""

from tests.task_fixtures import isodate_tasks, task_cache, task_cache_dir  # noqa: F401
