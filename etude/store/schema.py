"""The store's tables (SQLAlchemy Core). Alembic migrations in `migrations/` create them.

Times are float seconds since the epoch (UTC), so window queries are plain comparisons on
every backend. Token ids and log-probs are JSON arrays: a few kilobytes per interaction at our
scale, and readable by any tool. Every row that belongs to a customer carries `org_id`, and the
store's read functions always filter on it.

NOTE: when you change a table here, add an alembic revision in `migrations/versions/` that makes
the same change; `tests/store/test_store.py` checks that the migrated database matches this file.
"""

from __future__ import annotations

from sqlalchemy import JSON, Boolean, Column, Float, ForeignKey, Index, Integer, MetaData, String, Table, Text, false

metadata = MetaData()

orgs = Table(
    "orgs",
    metadata,
    Column("id", String(128), primary_key=True),  # the organisation's name, as given to `keys create`
    Column("created_at", Float, nullable=False),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String(32), primary_key=True),  # public prefix of the key, e.g. "3f9a1c07b2"
    Column("org_id", String(128), ForeignKey("orgs.id"), nullable=False, index=True),
    Column("key_hash", String(64), nullable=False),  # sha256 hex of the whole key; the key itself is never stored
    Column("name", String(256), nullable=False, default=""),
    Column("created_at", Float, nullable=False),
    Column("revoked_at", Float, nullable=True),
    # an admin key still belongs to its org (and acts as it on /v1); only /dashboard reads the flag
    Column("admin", Boolean, nullable=False, default=False, server_default=false()),
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("name", String(256), primary_key=True),  # what clients put in `model`
    Column("org_id", String(128), nullable=True, index=True),  # None: shared by every organisation
    Column("path", Text, nullable=False),  # "tiny", "smollm2", or a model/adapter directory
    Column("version", Integer, nullable=False, default=0),  # policy version (trainer step count)
    Column("state", String(16), nullable=False),  # candidate | canary | production | retired
    Column("parent", String(256), nullable=True),  # checkpoint it was trained from
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("meta", JSON, nullable=False, default=dict),
)

checkpoint_events = Table(
    "checkpoint_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("checkpoint", String(256), nullable=False, index=True),
    Column("from_state", String(16), nullable=True),
    Column("to_state", String(16), nullable=False),
    Column("at", Float, nullable=False),
    Column("reason", Text, nullable=False, default=""),
)

experiments = Table(
    "experiments",
    metadata,
    Column("id", String(128), primary_key=True),
    Column("org_id", String(128), nullable=True, index=True),  # None: applies to every organisation
    Column("salt", String(64), nullable=False),
    Column("arms", JSON, nullable=False),  # [{"name": "control", "checkpoint": "...", "weight": 0.9}, ...]
    Column("status", String(16), nullable=False),  # active | stopped
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

experiment_readouts = Table(
    "experiment_readouts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("experiment_id", String(128), nullable=False, index=True),
    Column("org_id", String(128), nullable=True),  # the experiment's scope
    Column("at", Float, nullable=False),
    # what the loop decided on: {"round", "ab", "plan", "primary", "arm_ratios", "alarms", "decision", "reason"}
    Column("readout", JSON, nullable=False),
)

experiment_plans = Table(
    "experiment_plans",
    metadata,
    Column("experiment_id", String(128), primary_key=True),  # one plan per experiment, registered before traffic
    Column("org_id", String(128), nullable=True),
    Column("registered_at", Float, nullable=False),
    Column("sha256", String(64), nullable=False),  # of the plan's canonical JSON
    # {"primary", "primary_higher_is_better", "guardrails": [{"metric", "higher_is_better", "margin"}], "alpha",
    #  "harm_margin", "mde", "mde_source", "users_per_arm", "sessions_per_user", "mode", ...}
    Column("plan", JSON, nullable=False),
)

sessions = Table(
    "sessions",
    metadata,
    Column("org_id", String(128), primary_key=True),
    Column("session_id", String(256), primary_key=True),
    Column("user_id", String(256), nullable=False),
    Column("checkpoint", String(256), nullable=False),  # pinned on the first request of the session
    Column("experiment_id", String(128), nullable=True),
    Column("arm", String(128), nullable=True),
    Column("created_at", Float, nullable=False),
)

interactions = Table(
    "interactions",
    metadata,
    Column("id", String(64), primary_key=True),  # also the response `id` and header x-etude-interaction-id
    Column("org_id", String(128), nullable=False),
    Column("user_id", String(256), nullable=False),
    Column("session_id", String(256), nullable=False),
    Column("model", String(256), nullable=False),  # what the client asked for ("auto" or a name)
    Column("checkpoint", String(256), nullable=False),  # what actually answered
    Column("policy_version", Integer, nullable=False),
    Column("experiment_id", String(128), nullable=True),
    Column("arm", String(128), nullable=True),
    Column("created_at", Float, nullable=False),
    Column("params", JSON, nullable=False),  # temperature, max_tokens, stream, tool names, ...
    Column("tools", JSON, nullable=False),  # the request's tool schemas
    Column("response", JSON, nullable=False),  # {"content", "tool_calls", "parse_errors", "raw_text"}
    Column("finish_reason", String(32), nullable=False),
    Column("prompt_token_ids", JSON, nullable=False),
    Column("completion_token_ids", JSON, nullable=False),
    Column("logprobs", JSON, nullable=False),  # [num_completion_tokens], behaviour log-probs
    Column("prompt_tokens", Integer, nullable=False),
    Column("completion_tokens", Integer, nullable=False),
    Column("latency_s", Float, nullable=False),  # request received -> response ready
    Column("ttft_s", Float, nullable=True),  # request received -> first token (server side)
    Column("queue_s", Float, nullable=True),  # time waiting for the batcher
    Index("ix_interactions_org_time", "org_id", "created_at"),
    Index("ix_interactions_org_session", "org_id", "session_id"),
    Index("ix_interactions_org_checkpoint", "org_id", "checkpoint"),
)

messages = Table(
    "messages",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("interaction_id", String(64), ForeignKey("interactions.id"), nullable=False, index=True),
    Column("org_id", String(128), nullable=False),
    Column("position", Integer, nullable=False),  # index in the request's `messages`
    Column("role", String(16), nullable=False),
    Column("content", Text, nullable=False),
    Column("tool_calls", JSON, nullable=False),
    Column("tool_call_id", String(128), nullable=True),
    Column("label", String(64), nullable=True),  # follow-up class of a user message, e.g. "dissatisfied"
    Column("label_source", String(64), nullable=True),  # "rules" | "model:<name>" | "client"
)

feedback = Table(
    "feedback",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("org_id", String(128), nullable=False),
    Column("interaction_id", String(64), ForeignKey("interactions.id"), nullable=False, index=True),
    Column("kind", String(32), nullable=False),  # edit_persistence | followup | latency | accept | reject | retry
    Column("value", Float, nullable=True),
    Column("data", JSON, nullable=False),
    Column("source", String(32), nullable=False),  # "client" | "server"
    Column("created_at", Float, nullable=False),
    Index("ix_feedback_org_time", "org_id", "created_at"),
)
