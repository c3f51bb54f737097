"""Feedback from real use: signals (etude.feedback.signals), the client that reports them
(etude.feedback.client) and distillation of interactions + feedback into scored samples.

```python
from etude.feedback import distill, DistillConfig, report_feedback, measure_edit_persistence
```
Imports here stay light (no torch, no SQLAlchemy): the reward terms import `signals` through it.
"""

from etude.feedback.client import (
    AgentWrite,
    PersistenceReport,
    edits_from_trajectory,
    measure_edit_persistence,
    report_edit_persistence,
    report_feedback,
    report_latency,
)
from etude.feedback.distill import DistillConfig, DistillResult, ScoredSample, distill, to_trajectory

__all__ = [
    "AgentWrite",
    "DistillConfig",
    "DistillResult",
    "PersistenceReport",
    "ScoredSample",
    "distill",
    "edits_from_trajectory",
    "measure_edit_persistence",
    "report_edit_persistence",
    "report_feedback",
    "report_latency",
    "to_trajectory",
]
