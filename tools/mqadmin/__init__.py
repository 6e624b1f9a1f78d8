"""`mqadmin`, RocketMQ's admin console: `python -m pocketmq.tools.mqadmin <command> ...`.

    commands.py   the command table, the request helpers and `main`
    tables.py     pure text formatting of what the commands print
"""
from pocketmq.tools.mqadmin.commands import main

__all__ = ["main"]
