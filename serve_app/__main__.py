import sys

from serve_app.cli import main

sys.exit(main())
