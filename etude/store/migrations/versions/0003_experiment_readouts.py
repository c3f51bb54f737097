"""experiment_readouts: the A/B readouts the loop decided on, for `etude serve`'s /dashboard

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-21 10:00:00.000000

"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = '0003'
down_revision: str | Sequence[str] | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        'experiment_readouts',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('experiment_id', sa.String(length=128), nullable=False),
        sa.Column('org_id', sa.String(length=128), nullable=True),
        sa.Column('at', sa.Float(), nullable=False),
        sa.Column('readout', sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('experiment_readouts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_experiment_readouts_experiment_id'), ['experiment_id'], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('experiment_readouts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_experiment_readouts_experiment_id'))
    op.drop_table('experiment_readouts')
