import sys

from pocketmq.tools.mqadmin.commands import main

sys.exit(main())
