"""The paths a client without the right key must not get through, whichever front end guards vLLM: vLLM's control
routes (an admin key's) and paths the route table does not declare (nobody's)."""

CONTROL = [("POST", "/sleep?level=1"), ("POST", "/wake_up"), ("POST", "/collective_rpc"), ("POST", "/pause"),
           ("POST", "/scale_elastic_ep"), ("POST", "/reset_prefix_cache"), ("POST", "/start_profile"),
           ("GET", "/server_info"), ("POST", "/v1/load_lora_adapter"), ("GET", "/is_sleeping"),
           ("POST", "/inference/v1/abort_requests")]  # fmt: skip

UNDECLARED = ["/v1/nope", "/metrics/x", "/V1/models", "//v1/models", "/v1/models/x/y", "/v1/responses/a%20b", "/debug",
              "/"]  # fmt: skip
