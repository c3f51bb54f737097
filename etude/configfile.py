"""Reading a component's TOML config file: one place for the operator-facing errors."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from etude.errors import EtudeError


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The parsed file, or an EtudeError "cannot read <what> <path>: <reason>" (missing file,
    permission, invalid TOML) — never a traceback."""
    p = Path(path)
    try:
        return tomllib.loads(p.read_text())
    except OSError as e:
        raise EtudeError(f"cannot read {what} {p}: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise EtudeError(f"cannot read {what} {p}: invalid TOML: {e}") from None
