"""etude's OpenAI-compatible server, API keys, checkpoint registry and `auto` router.

```python
from etude.serve import ServeConfig, build_app, serve
from etude.serve.registry import register_checkpoint, promote, rollback, set_experiment
from etude.serve.router import Router, bucket, choose_arm
```
See docs/serve.md.
"""

from etude.serve.config import ServeConfig
from etude.serve.run import build_app, ensure_model, serve

__all__ = ["ServeConfig", "build_app", "ensure_model", "serve"]
