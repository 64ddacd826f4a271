"""The guard as Envoy's external processor (envoy.filters.http.ext_proc over gRPC): the second front end beside
server/, around the same core (exchange/). Needs the extproc extra: `pip install token-guard[extproc]`."""
