import sys

from rayft.cli import main

sys.exit(main())
