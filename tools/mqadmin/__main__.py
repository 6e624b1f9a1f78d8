import sys

from pocketmq.tools.mqadmin.cli import main

sys.exit(main())
