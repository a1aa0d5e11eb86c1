"""``notifier console``: the operators' web pages over the notifications table.

``app`` builds the Starlette application (login, CSRF, security headers, access log),
``pages`` serves what there is to look at, ``actions`` what an admin may change, ``queries``
holds all of its SQL, ``auth`` the users, password hashes and sessions, ``limits`` the limits
on password guesses, ``gate`` the hosts, origins and clients it accepts, and ``command`` the
``notifier console`` subcommands. Nothing here is imported by the worker.
"""
