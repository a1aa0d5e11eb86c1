"""``notifier console``: the operators' web pages over the notifications table.

``app`` builds the Starlette application (login, CSRF, security headers, access log),
``pages`` serves what there is to look at, ``actions`` what an admin may change, ``queries``
holds all of its SQL, ``auth`` the users, password hashes and sessions, and ``command`` the
``notifier console`` subcommands. Nothing here is imported by the worker.
"""
