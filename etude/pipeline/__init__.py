"""The learning pipeline, once: resumable stages (`stages`), the general base -> SFT -> RL path
and its shared stage work (`learning`), the function-level split of an organisation's tasks
(`split`), paired comparisons (`compare`), and `etude specialise` (`specialise`, with its report).
`etude demo`, `bench/agent_learning.py` and `bench/specialise.py` run their stages here."""
