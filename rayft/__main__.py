import sys

from rayft.cli import main

if __name__ == "__main__":  # not when a spawned child (the service's watch process) imports it
    sys.exit(main())
