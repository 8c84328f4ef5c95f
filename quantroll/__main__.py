import sys

from quantroll.cli import main

sys.exit(main())
