"""`python -m pocketmq` is the `pocketmq` command."""
import sys

from pocketmq.cli import main

sys.exit(main())
