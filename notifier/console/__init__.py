"""``notifier console``: the operators' web pages over the notifications table.

``app`` builds the Starlette application (login, CSRF, security headers, access log),
``pages`` serves what there is to look at, ``actions`` what an admin may change (their SQL is
``notifier.db``'s, mostly ``listing``, ``rows`` and ``stats``, shared with the ``notifier``
command), ``auth`` the users, password hashes and sessions, ``limits`` the limits on password
guesses, and ``gate`` the hosts, origins and clients it accepts; the ``notifier console``
subcommands are in ``notifier.cli.console``. Nothing here is imported by the worker.
"""
