"""The commands that need no scheduler: ``arylctl login`` (store a token) and ``arylctl completion``
(a shell completion script). ``arylctl.cli.main`` runs them without a client."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from aryl_common.security import default_token_file
from arylctl import completion
from arylctl.args import AddCommand
from arylctl.login import UnsafeTokenPath, store_token
from arylctl.output import EXIT_OK, EXIT_USAGE, PROG


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


def run_login(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """``login``: the token from ``--token`` or stdin, kept in a file only the user can read."""
    token = (args.token if args.token is not None else sys.stdin.readline()).strip()
    if not token or any(c.isspace() for c in token):
        print("error: the token is empty or has spaces; paste it as issued (token-NAME of arylctl certs init)",
              file=stderr)
        return EXIT_USAGE
    path = Path(args.file) if args.file else default_token_file()
    try:
        store_token(path, token)
    except UnsafeTokenPath as exc:
        print(f"error: {exc}", file=stderr)
        return EXIT_USAGE
    print(f"token stored in {path} (mode 0600)", file=stdout)
    return EXIT_OK
