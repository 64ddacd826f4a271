"""The decision: from a request and its count, a plan (pass, clamp, reject, truncate, chunk) and the merge of a
chunked request's answers. Pure: no HTTP."""
