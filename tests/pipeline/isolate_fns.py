"""Module-level functions for tests/pipeline/test_isolate.py (spawn pickles a function by name)."""

import os

from etude.errors import EtudeError


def hold_memory(mib: int) -> dict:
    """Touch `mib` MiB, then report this process's id and peak RSS in MiB."""
    import resource

    block = bytearray(mib * 2**20)
    block[:: 4096] = b"x" * len(block[:: 4096])
    return {"pid": os.getpid(), "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}


def refuse(msg: str) -> None:
    raise EtudeError(msg)


def crash() -> None:
    return {}["missing"]


def die(code: int) -> None:
    os._exit(code)
