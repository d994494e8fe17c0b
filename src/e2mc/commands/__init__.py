"""Subcommands of the ``e2mc`` CLI: one module per command, each with ``register(subparsers)``.

Modules must import heavy dependencies (torch, torchvision) inside their ``func``, not at module
level, so that ``e2mc --help`` stays fast.
"""
