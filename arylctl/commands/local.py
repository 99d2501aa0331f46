"""The commands that need no scheduler: ``arylctl login`` (store a token) and ``arylctl completion``
(a shell completion script). ``arylctl.cli.main`` runs them without a client."""

from __future__ import annotations

import argparse

from arylctl import completion
from arylctl.args import (
    AddCommand,
)
from arylctl.output import (
    PROG,
)


def add_login_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``login [--token T] [--file PATH]``."""
    login = add("login", None, "store your token for later commands (a file only you can read)",
                epilog="The token is read from stdin (or --token) and kept in $XDG_CONFIG_HOME/aryl/token "
                       "(~/.config/aryl/token), mode 0600; ARYL_TOKEN overrides it. docs/security.md.")
    login.add_argument("--token", help="the token (default: read from stdin, so it stays out of shell history)")
    login.add_argument("--file", help="where to keep it (default: ~/.config/aryl/token)")



def add_completion_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``completion bash|zsh``."""
    add("completion", None, "print a shell completion script",
        epilog=f"bash: source <({PROG} completion bash), or save it in /etc/bash_completion.d/{PROG}. "
               f"zsh: source <({PROG} completion zsh). Job ids and server names are completed from what "
               f"the scheduler lists ({PROG} jobs|servers -o name).").add_argument("shell", choices=completion.SHELLS)
