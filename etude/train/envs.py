"""The training environments' old address: they live in etude.envs.families (one env home)."""

from etude.envs.families import (
    ENVS,
    PYFUNCS,
    ArithEnv,
    EpisodesEnv,
    FixTurnEnv,
    PyFuncEnv,
    SingleTurnEnv,
    TasksEnv,
    extract_code,
    make_env,
)
from etude.types import Episode, Message, Problem, TurnSample

__all__ = ["ENVS", "PYFUNCS", "ArithEnv", "Episode", "EpisodesEnv", "FixTurnEnv", "Message", "Problem", "PyFuncEnv",
           "SingleTurnEnv", "TasksEnv", "TurnSample", "extract_code", "make_env"]
