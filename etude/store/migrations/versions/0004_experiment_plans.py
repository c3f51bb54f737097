"""experiment_plans: the canary plan each experiment registered before its first user (issue 46)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-07 10:00:00.000000

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = '0004'
down_revision: str | Sequence[str] | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        'experiment_plans',
        sa.Column('experiment_id', sa.String(length=128), nullable=False),
        sa.Column('org_id', sa.String(length=128), nullable=True),
        sa.Column('registered_at', sa.Float(), nullable=False),
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('plan', sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint('experiment_id'),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table('experiment_plans')
