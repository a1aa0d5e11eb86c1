"""``notifier console``: the operators' web pages over the notifications table.

``app`` builds the Starlette application (login, CSRF, security headers, access log),
``pages`` serves what there is to look at, ``actions`` what an admin may change, ``auth`` the
users, password hashes and sessions, ``limits`` the limits on password guesses, and ``gate``
the hosts, origins and clients it accepts. Its SQL lives in ``notifier.db``, and the ``notifier
console`` subcommands in ``notifier.cli.console``. Nothing here is imported by the worker.
"""
