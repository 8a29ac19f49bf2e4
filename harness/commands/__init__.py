"""The `lockstep` subcommands, one module each (harness/cli.py builds the parser and dispatches).

options.py holds the argument types every command shares, so a flag means the same thing in all
of them (`--seed 3,4` in generate and record)."""
