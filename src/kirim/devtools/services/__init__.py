"""Loopback fakes of the services kirim's providers speak to (APNs, FCM, Web Push,
Twilio, Slack), for the tests and ``kirim simulate --channel apns|fcm|webpush|sms``:
each checks what its service checks, answers with its documented error bodies, and
counts what the user's device shows (``kirim.devtools.services.base``)."""
