"""Shell completion for arylctl, generated from its own argument parser so it cannot drift.

``arylctl completion bash`` prints a bash script (``source <(arylctl completion bash)``, or save it
under ``/etc/bash_completion.d/``); ``arylctl completion zsh`` prints the same script behind zsh's
``bashcompinit``. It completes commands and sub-commands, each command's flags, the values of flags
that take a fixed set (``-o``, ``--restart-policy``), and, for the commands that take a job id
(``job``, ``logs``, ``cancel``, ``explain``) or a server (``--server-id``, ``servers`` sub-commands),
the ids the scheduler lists (``arylctl jobs|servers -o name``), asked only when TAB is pressed there.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator

# Positionals (by metavar) and flags whose values the scheduler knows, and how to list them.
_DYNAMIC = {
    "ID": "jobs",
    "HOSTNAME": "servers",
    "--job": "jobs",
    "--server-id": "servers",
}
SHELLS = ("bash", "zsh")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse exposes no public walk over a parser's sub-parsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for name, sub in _subcommands(parser).items():
        yield from _walk(sub, (*path, name))


def _positional_name(action: argparse.Action) -> str:
    return action.metavar if isinstance(action.metavar, str) else action.dest


def _key(path: tuple[str, ...]) -> str:
    return " ".join(path) or "_"  # bash's associative arrays refuse the empty key


def bash_script(parser: argparse.ArgumentParser) -> str:
    """The bash completion script for ``parser`` (arylctl's)."""
    prog = parser.prog
    words: dict[str, list[str]] = {}
    choices: dict[str, str] = {}
    dynamic: dict[str, str] = {}
    for path, sub in _walk(parser):
        key = _key(path)
        flags = [s for a in sub._actions for s in a.option_strings if a.help != argparse.SUPPRESS]
        words[key] = [*_subcommands(sub), *flags]
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            for name in action.option_strings or [_positional_name(action)]:
                if action.choices is not None:
                    choices[f"{key}|{name}"] = " ".join(str(c) for c in action.choices)
                elif name in _DYNAMIC:
                    dynamic[f"{key}|{name}"] = _DYNAMIC[name]
    # Flags that take a value: the word after them is that value, never a command.
    valued = sorted({f"{_key(path)}|{s}" for path, sub in _walk(parser) for a in sub._actions for s in a.option_strings
                     if a.nargs != 0 and not isinstance(a, argparse._HelpAction | argparse._VersionAction)})
    # Each command's first positional with values to offer (a job id, a shell name).
    positional_of = {
        _key(path): next((name for a in sub._actions if not a.option_strings
                          and not isinstance(a, argparse._SubParsersAction)
                          for name in [_positional_name(a)]
                          if f"{_key(path)}|{name}" in dynamic or f"{_key(path)}|{name}" in choices), "")
        for path, sub in _walk(parser)
    }

    def assoc(name: str, table: dict[str, str]) -> str:
        body = "\n".join(f"  [{shlex.quote(k)}]={shlex.quote(v)}" for k, v in sorted(table.items()))
        return f"declare -gA {name}=(\n{body}\n)"

    fn = f"_{prog}_complete"
    return "\n".join([
        f"# {prog} completion for bash: source <({prog} completion bash)",
        assoc(f"_{prog}_words", {k: " ".join(v) for k, v in words.items()}),
        assoc(f"_{prog}_choices", choices),
        assoc(f"_{prog}_dynamic", dynamic),
        assoc(f"_{prog}_positional", {k: v for k, v in positional_of.items() if v}),
        f"_{prog}_valued=' {' '.join(valued)} '",
        f"{fn}() {{",
        '  local cur="${COMP_WORDS[COMP_CWORD]}" prev="" key="_" i w next server=""',
        '  [[ $COMP_CWORD -gt 0 ]] && prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '  for ((i = 1; i < COMP_CWORD; i++)); do',
        '    w="${COMP_WORDS[i]}"',
        '    [[ $w == -- ]] && return 0  # the job\'s own command line: let bash complete files',
        '    [[ $w == --server ]] && server="${COMP_WORDS[i+1]}"',
        f'    if [[ $_{prog}_valued == *" $key|$w "* ]]; then ((i++)); continue; fi',
        '    [[ $w == -* ]] && continue',
        '    if [[ $key == _ ]]; then next="$w"; else next="$key $w"; fi',
        f'    if [[ -n "${{_{prog}_words[$next]+x}}" ]]; then key="$next"; fi',
        '  done',
        f'  local value="${{_{prog}_choices[$key|$prev]}}" source="${{_{prog}_dynamic[$key|$prev]}}"',
        f'  if [[ -z $value && -z $source && $cur != -* && $_{prog}_valued != *" $key|$prev "* ]]; then',
        f'    local positional="${{_{prog}_positional[$key]}}"',
        '    if [[ -n $positional ]]; then',
        f'      value="${{_{prog}_choices[$key|$positional]}}" source="${{_{prog}_dynamic[$key|$positional]}}"',
        '    fi',
        '  fi',
        '  if [[ -n $source ]]; then',
        f'    value="$(command {prog} ${{server:+--server "$server"}} --timeout 3 "$source" -o name 2>/dev/null)"',
        f'  elif [[ -z $value && $_{prog}_valued == *" $key|$prev "* ]]; then',
        '    return 0  # a free-form value: nothing to offer',
        '  elif [[ -z $value ]]; then',
        f'    value="${{_{prog}_words[$key]}}"',
        '  fi',
        '  COMPREPLY=($(compgen -W "$value" -- "$cur"))',
        "}",
        f"complete -o default -F {fn} {prog}",
        "",
    ])


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell`` (one of ``SHELLS``)."""
    if shell == "zsh":
        return "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n" + bash_script(
            parser)
    return bash_script(parser)
