import sys

from tuitune.cli import main

sys.exit(main())
