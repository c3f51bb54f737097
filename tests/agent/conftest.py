from tests.task_fixtures import isodate_tasks, task_cache, task_cache_dir  # noqa: F401
