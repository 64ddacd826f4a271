"""The ASGI side: the app and its handlers, middlewares, relaying answers to the client, request records, metrics
and logs."""
