"""``python -m servebook`` is the same as the ``servebook`` command."""
from servebook.cli import main

raise SystemExit(main())
