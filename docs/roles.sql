-- Logins for notifier's database roles. Run as an administrator after `notifier migrate`,
-- which creates the four group roles (NOLOGIN) and grants them their privileges in the
-- database it migrates (see docs/database-roles.md). Replace the names and passwords.

-- A service that writes notifications (INSERT by the producer contract, cancel by key or id).
CREATE ROLE billing_service LOGIN PASSWORD 'change me' IN ROLE notifier_producer;
-- Its rows carry its name in `producer`, and it cancels only those: the login name, or the
-- name given here (only an administrator may; a session that SETs another one is refused).
-- Give two logins of one service the same name to let each cancel the other's rows.
ALTER ROLE billing_service SET notifier.producer = 'billing';

-- The Celery workers and beat, `notifier metrics` and the workers' `notifier health`.
CREATE ROLE notifier_worker_login LOGIN PASSWORD 'change me' IN ROLE notifier_worker;

-- `notifier api`: writes rows as each API key's name, reads them, cancels them (docs/api.md).
CREATE ROLE notifier_api_login LOGIN PASSWORD 'change me' IN ROLE notifier_api;

-- People and jobs running the `notifier` command's day-two work (stats, show, requeue,
-- cancel, purge, send, campaigns, templates, suppressions). notifier_operator is a member of
-- notifier_audience, so these logins may SET ROLE to it for audience queries.
CREATE ROLE ops_alice LOGIN PASSWORD 'change me' IN ROLE notifier_operator;

-- An audience query (`notifier campaign audience NAME --query ...`) runs as notifier_audience,
-- read-only, which may read nothing until it is granted what audience queries need:
GRANT SELECT ON users TO notifier_audience;
-- or only some columns:  GRANT SELECT (email, first_name, opted_in) ON users TO notifier_audience;

-- Each process then connects as its own login, e.g.
--   NOTIFIER_DATABASE_URL=postgresql://notifier_worker_login:...@db:5432/notifier
-- and `notifier migrate` keeps connecting as the administrator (it owns the schema).

-- Removing the roles: they belong to the whole cluster and notifier_audience owns the function
-- notifier_audience_rows in every notifier database. In each such database, first:
--   DROP OWNED BY notifier_producer, notifier_worker, notifier_operator, notifier_audience,
--                 notifier_api;
-- then, once:
--   DROP ROLE billing_service, notifier_worker_login, ops_alice, notifier_api_login;
--   DROP ROLE notifier_producer, notifier_worker, notifier_operator, notifier_audience,
--             notifier_api;
