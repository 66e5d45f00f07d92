"""`option`: a dataclass field that is also a command-line flag (cli/args.py generates the flags).
Stdlib only, so that the plain data types (types.py) and the configs (config.py) both declare theirs."""
from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:
    from .registry import Registry


def option(default: Any, help: str, *, flag: Optional[str] = None, parse: Optional[str] = None,
           choices: Union[tuple, "Registry", None] = None) -> Any:
    """A dataclass field that is also a flag. flag: its name when not --field-name ("--no-x" on a bool:
    the flag turns it off, with no --x); parse: the name of an argparse type in cli/args.PARSERS (the
    default: the field's own type); choices: the values allowed (a Registry: its names, read when the
    parser is built, and its entries' help listed in the flag's)."""
    return field(default=default, metadata={"help": help, "flag": flag, "parse": parse, "choices": choices})
