"""`--set key=value` overrides shared by `etude train` and `etude sft`: the one parser lives in
etude.configfile (every component's loader applies its result the same way)."""

from etude.configfile import parse_set

__all__ = ["parse_set"]
