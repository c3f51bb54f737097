"""Resumable stages with one on-disk layout: what `etude specialise`, `etude demo` and the
learning benches run their steps through.

`Stages(out, config)` keeps OUT/state.json: per finished stage its one-line summary, its wall
seconds and its JSON result. `run(name, fn)` prints a rule, calls `fn() -> (result, summary)`
unless the stage already finished under the same config (then it reads the result back), and
records it atomically. A rerun with the same OUT resumes after the last finished stage.

A rerun under another config redoes only what the change reaches: a stage that declares `uses`
(the config fields it reads) and `after` (the stages whose outputs it reads) is read back when
those fields have the values it finished under and none of its `after` stages was redone in
this invocation; a stage that declares no `uses` depends on the whole config. So a rerun with a
larger training budget keeps the tasks, the split and the base model's evaluations. Resumed
stages keep their original seconds, so a report's stage times are never resume times.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

StageFn = Callable[[], tuple[Any, str]]


def jsonable(x: Any) -> Any:
    """`x` as plain JSON data (dataclasses as dicts, anything else unknown as its str)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        x = dataclasses.asdict(x)
    return json.loads(json.dumps(x, default=str))


@dataclasses.dataclass
class StageRecord:
    name: str
    summary: str
    seconds: float  # wall seconds of the run that did the work (not of a resume)
    resumed: bool  # read back from an earlier invocation


class Stages:
    def __init__(self, out: Path, config: Any, console: Console | None = None, state_file: str = "state.json"):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.con = console or Console()
        self.path = self.out / state_file
        self.records: list[StageRecord] = []
        self.redone: set[str] = set()  # stages this invocation ran (their outputs are new)
        cfg = jsonable(config)
        self.state: dict[str, Any] = json.loads(self.path.read_text()) if self.path.is_file() else {}
        old = self.state.get("config")
        for st in self.state.get("stages", {}).values():  # state written before stages kept their inputs
            st.setdefault("inputs", old if isinstance(old, dict) else {})
        if isinstance(old, dict) and old != cfg:
            changed = sorted(k for k in set(old) | set(cfg) if old.get(k) != cfg.get(k))
            self.con.print(f"[yellow]{self.out} holds a run with another configuration ({', '.join(changed)} "
                           "changed): stages that use those fields run again[/yellow]")
        self.config = cfg
        self.state["config"] = cfg
        self.state.setdefault("stages", {})
        self.state.setdefault("invocations", []).append({"started": time.time()})

    def _inputs(self, uses: tuple[str, ...] | None) -> dict[str, Any]:
        return dict(self.config) if uses is None else {k: self.config.get(k) for k in uses}

    def reusable(self, name: str, uses: tuple[str, ...] | None = None, after: tuple[str, ...] = ()) -> bool:
        """Whether stage `name` finished under the current values of the fields it uses, after
        none of its `after` stages was redone in this invocation."""
        st = self.state["stages"].get(name)
        if st is None or any(a in self.redone for a in after):
            return False
        had = st.get("inputs", {})
        # a field added to the config since, left unset (None), changes nothing that ran without it
        return all(had.get(k) == v for k, v in self._inputs(uses).items() if k in had or v is not None)

    def done(self, name: str) -> bool:
        return name in self.state["stages"]

    def result(self, name: str) -> Any:
        return self.state["stages"][name]["result"]

    def run(self, name: str, fn: StageFn, *, resumable: bool = True, uses: tuple[str, ...] | None = None,
            after: tuple[str, ...] = ()) -> Any:
        self.con.rule(f"[bold]{name}")
        if resumable and self.reusable(name, uses, after):
            st = self.state["stages"][name]
            self.records.append(StageRecord(name, st["summary"], st["seconds"], True))
            self.con.print(f"[green]✓[/green] {name}: {st['summary']}  (from an earlier run, {st['seconds']:.1f} s)")
            return st["result"]
        self.state["stages"].pop(name, None)  # a stage run again is not done until it finishes
        self.redone.add(name)
        t0 = time.monotonic()
        result, summary = fn()
        dt = time.monotonic() - t0
        self.records.append(StageRecord(name, summary, dt, False))
        self.con.print(f"[green]✓[/green] {name}: {summary}  ({dt:.1f} s)")
        if resumable:
            self.state["stages"][name] = {"summary": summary, "seconds": dt, "result": jsonable(result),
                                          "finished": time.time(), "inputs": self._inputs(uses)}
            self.save()
        return result

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, default=str))
        tmp.replace(self.path)

    def times(self) -> dict[str, dict[str, Any]]:
        """Per stage: its wall seconds (from the run that did it) and whether this run resumed it."""
        return {r.name: {"seconds": round(r.seconds, 1), "resumed": r.resumed} for r in self.records}
