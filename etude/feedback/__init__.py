"""Feedback from real use: signals (etude.feedback.signals) and the client that reports them
(etude.feedback.client). Distillation of interactions + feedback into scored samples is the
loop's (etude.loop.distill); the reward terms that read these signals are the rewards'
(etude.rewards.production).

```python
from etude.feedback import report_feedback, measure_edit_persistence, edits_from_trajectory
```
Imports here stay light (no torch, no SQLAlchemy).
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

__all__ = [
    "AgentWrite",
    "PersistenceReport",
    "edits_from_trajectory",
    "measure_edit_persistence",
    "report_edit_persistence",
    "report_feedback",
    "report_latency",
]
