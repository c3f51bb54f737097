"""etude's durable store: interactions, messages, feedback, API keys, checkpoint registry rows.

```python
from etude.store import open_store
store = open_store()            # $ETUDE_DB, else sqlite:///<ETUDE_HOME>/etude.db; migrated on open
store.log_interaction({...})    # durable when it returns (SQLite WAL + synchronous=FULL)
store.interactions(org="acme", since=t0, arm="canary")   # every read takes an org
```
See docs/store.md for the tables and what is (and is not) guaranteed.
"""

from etude.store.engine import resolve_url
from etude.store.sql import FEEDBACK_KINDS, SQLStore, hash_key, new_id, open_store

__all__ = ["FEEDBACK_KINDS", "SQLStore", "hash_key", "new_id", "open_store", "resolve_url"]
