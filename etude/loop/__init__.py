"""The real-time RL loop: collect → distill → train → eval gate → register → canary A/B →
readout → promote or roll back, resumable stage by stage (see docs/loop.md).

```python
from etude.loop import LoopConfig, run_cycle
report = run_cycle(LoopConfig.from_toml("configs/loop_tiny.toml"))
report.to_dict()["decision"]        # "promote" | "rollback" | "skip"
```
Imports here stay light; stages import their components when they run.
"""

from etude.loop.config import LoopConfig
from etude.loop.cycle import CycleReport, TrafficContext, run_cycle

__all__ = ["CycleReport", "LoopConfig", "TrafficContext", "run_cycle"]
