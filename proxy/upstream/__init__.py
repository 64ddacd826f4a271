"""The upstream side: the HTTP client (the one place its errors are translated), replicas and routing, admission by
KV cost, model discovery, and running the chunks of a chunked request."""
