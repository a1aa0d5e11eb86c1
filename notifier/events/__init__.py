"""Delivery feedback: what providers report after they accepted a message.

``notifier events`` serves ``app.create_app``: providers' delivery webhooks, each verified the
way its provider documents (one module each: ``sns``, ``sendgrid``, ``mailgun``, ``postmark``,
``twilio``), turned into ``model.Event`` values and applied to rows by ``state``, whose SQL is
all in ``notifier.db``. ``notifier.unsubscribe`` signs and reads one-click unsubscribe tokens
(RFC 8058).
"""
