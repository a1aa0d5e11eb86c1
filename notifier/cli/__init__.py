"""The ``notifier`` command: one module per command group, the root in ``notifier.cli.main``."""
