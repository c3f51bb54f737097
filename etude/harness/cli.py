"""`etude parse` (the tool-call parser on stdin) and `etude agent` (a coding agent on a repository)."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Annotated

import typer

from etude.errors import EtudeError
from etude.harness.agent import EXAMPLE_REPO, EXAMPLE_SESSION, edit_feedback, run_on_repo, summary
from etude.harness.config import HarnessConfig
from etude.policy import POLICIES, make_policy
from etude.policy.scripted import load_script
from etude.toolcalls import FORMATS, parse_output, to_json_dict


def register(app: typer.Typer) -> None:
    app.command("parse")(parse)
    app.command("agent")(agent)
    app.command("agent-feedback")(agent_feedback)


def parse(
    fmt: Annotated[str, typer.Option("--format", help="auto | openai | hermes | mistral | llama3_json")] = "auto",
    tools: Annotated[str | None, typer.Option("--tools", help="comma-separated tool names; calls to others are errors")] = None,
) -> None:
    """Parse model output on stdin; print {"text", "tool_calls": [{"id","name","arguments"}], "errors"} as JSON."""
    if fmt not in FORMATS:
        raise EtudeError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    names = [t.strip() for t in tools.split(",") if t.strip()] if tools else None
    res = parse_output(sys.stdin.read(), fmt, tools=names)
    print(json.dumps(to_json_dict(res), ensure_ascii=False))


def agent(
    request: Annotated[str | None, typer.Argument(help="what the agent should do (optional with --example or a script holding one)")] = None,
    repo: Annotated[Path | None, typer.Option("--repo", help="the repository to work on (it is not modified without --apply)")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")] = None,
    model: Annotated[str | None, typer.Option("--model", help="model name on that server (or a local model name/path)")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar="ETUDE_API_KEY", help="API key for --base-url")] = None,
    policy: Annotated[str, typer.Option("--policy", help="auto | openai | scripted | smollm2 | tiny | local")] = "auto",
    script: Annotated[Path | None, typer.Option("--script", help="a scripted session (JSON) for --policy scripted")] = None,
    example: Annotated[bool, typer.Option("--example", help="run the built-in example repository and scripted session")] = False,
    apply: Annotated[bool, typer.Option("--apply", help="apply the patch to --repo instead of printing it")] = False,
    max_steps: Annotated[int | None, typer.Option("--max-steps", help="most model turns")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", help="most tokens per model turn")] = None,
    time_limit: Annotated[float | None, typer.Option("--time-limit", help="episode wall-clock budget in seconds")] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", help="sampling temperature")] = None,
    trajectory: Annotated[Path | None, typer.Option("--trajectory", help="trajectory JSONL file (default under ETUDE_HOME/trajectories)")] = None,
    sandbox: Annotated[str, typer.Option("--sandbox", help="bwrap | unsandboxed (no isolation at all)")] = "bwrap",
    session: Annotated[str | None, typer.Option("--session", help="session id sent to the server (x-etude-session); default: a new one")] = None,
) -> None:
    """Run a coding agent on your repository: prints the patch (or applies it with --apply) and a summary."""
    from rich.console import Console


    err = Console(stderr=True)
    session = session or f"agent-{uuid.uuid4().hex[:12]}"
    request, repo, pol = _resolve(request, repo, policy, script, example, base_url, model, api_key, apply, session)
    meta = {"base_url": base_url, "session_id": session} if base_url else {}
    config = _config(max_steps, max_tokens, time_limit, temperature)
    with err.status("agent: step 1", spinner="dots") as status:
        def on_turn(turn) -> None:
            status.update(f"agent: step {turn.index + 2} · {len(turn.tool_executions)} tool call(s) in step {turn.index + 1}")

        run = run_on_repo(pol, request, repo, config, apply=apply, trajectory_path=trajectory,
                          sandbox_backend=sandbox, on_turn=on_turn, meta=meta)
    if not apply and run.patch:
        sys.stdout.write(run.patch if run.patch.endswith("\n") else run.patch + "\n")
    err.print(summary(run), highlight=False, markup=False, soft_wrap=True)
    if run.trajectory.stop_reason == "error":
        raise EtudeError(run.trajectory.meta.get("error") or "the agent stopped on an error")


def _resolve(request: str | None, repo: Path | None, policy: str, script: Path | None, example: bool,
             base_url: str | None, model: str | None, api_key: str | None, apply: bool, session: str) -> tuple:
    """-> (request, repo, policy object) from the command line, with clear errors."""
    if example:
        if apply:
            raise EtudeError("--apply with --example would edit the packaged example; copy it and use --repo instead")
        script, repo = script or EXAMPLE_SESSION, repo or EXAMPLE_REPO
    if policy == "auto":
        policy = "scripted" if script else "openai" if base_url else "smollm2"
    if policy not in POLICIES:
        raise EtudeError(f"unknown --policy {policy!r}; known: auto, {', '.join(POLICIES)}")
    data = None
    if policy == "scripted":
        if script is None:
            raise EtudeError("--policy scripted needs --script FILE.json (or --example)")
        data = load_script(script)
        request = request or data["request"]
        if repo is None and data.get("repo"):
            repo = Path(script).resolve().parent / data["repo"]
    elif policy == "openai" and (not base_url or not model):
        raise EtudeError("--policy openai needs --base-url URL and --model NAME")
    if not request:
        raise EtudeError("give the agent a REQUEST (what it should do)")
    if repo is None or not Path(repo).is_dir():
        raise EtudeError("--repo DIR is required" if repo is None else f"--repo is not a directory: {repo}")
    # I build the policy last: loading a local model takes seconds, bad arguments should not.
    if data is not None:
        pol = make_policy("scripted", outputs=data["outputs"])
    elif policy == "openai":
        pol = make_policy("openai", base_url=base_url, model=model, api_key=api_key, extra_headers={"x-etude-session": session})
    else:
        pol = make_policy(policy, **({"model": model} if model else {}))
    return request, repo, pol


def _config(max_steps: int | None, max_tokens: int | None, time_limit: float | None, temperature: float | None):
    changes = {"max_steps": max_steps, "max_tokens_per_turn": max_tokens, "time_limit_s": time_limit, "temperature": temperature}
    return HarnessConfig(**{k: v for k, v in changes.items() if v is not None})


def agent_feedback(
    trajectory: Annotated[Path, typer.Option("--trajectory", help="the trajectory file of an `etude agent` run")],
    repo: Annotated[Path | None, typer.Option("--repo", help="the repository (default: the one recorded in the trajectory)")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="server to report to (default: the one the agent used)")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar="ETUDE_API_KEY", help="API key for the server")] = None,
    send: Annotated[bool, typer.Option("--send/--no-send", help="report to the server, or only measure")] = True,
) -> None:
    """Measure how much of the agent's edits survive in the repository now; report it to the server."""
    print(json.dumps(edit_feedback(trajectory, repo, base_url=base_url, api_key=api_key, send=send)))
