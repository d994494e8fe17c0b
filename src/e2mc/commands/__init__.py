"""Subcommands of the ``e2mc`` CLI: one module per command, each with ``register(subparsers)``;
heavy imports (torch) go inside ``func`` so that ``e2mc --help`` stays fast."""
