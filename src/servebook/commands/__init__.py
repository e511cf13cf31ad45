"""Sub-commands of the ``servebook`` CLI; each module exposes ``register(subparsers)``."""
