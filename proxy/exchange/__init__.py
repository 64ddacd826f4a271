"""A request's exchange with the guard, whichever front end it came by: what serve (server/, HTTP) and the Envoy
external processor (extproc/, gRPC) share below them: the route table's verdict and the keys, the guard's decision
with its key's quota, the error answers, the request's record, log line and metrics, and the assembled core."""
