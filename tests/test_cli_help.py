"""Every help text of the CLI reads as written: typer renders help with rich markup, where an
unescaped `[serve]` is a style tag and vanishes ("TOML file with a  table")."""

import typer
from rich.text import Text

from etude.cli import app


def _commands(cmd, path: str = "etude"):
    yield path, cmd
    if hasattr(cmd, "list_commands"):  # a group (typer vendors its own click: no isinstance)
        ctx = cmd.context_class(cmd)
        for name in cmd.list_commands(ctx):
            yield from _commands(cmd.get_command(ctx, name), f"{path} {name}")


def test_no_help_text_loses_a_bracketed_word_to_rich_markup():
    lost, seen = [], 0
    for path, cmd in _commands(typer.main.get_command(app)):
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        for text in texts:
            if Text.from_markup(text).plain != text.replace("\\[", "["):
                lost.append(f"{path}: {text[:80]}")
        seen += 1
    assert seen > 40  # every subcommand was walked (44 today)
    assert not lost, lost
