"""workwarden.service: the authority over HTTP, its operator console and its metrics.

`workwarden.service.app.create_app(config)` builds one ASGI application (FastAPI) serving:

- the HTTP JSON API (`/v1/...`): every `Authority` operation, the batch
  calls among them (`workwarden.service.batches`), its request and
  reply bodies the models of `workwarden.statemachine`, refusals as
  `application/problem+json` carrying the catalogue code and its class
  (`workwarden.service.problems`), callers authenticated by signed bearer
  tokens and allowed per operation by the spec's operations table
  (`workwarden.service.auth`); the OpenAPI document is `/openapi.json`;
- the operator console (`/console/...`), server-rendered pages
  (`workwarden.service.console`);
- Prometheus metrics (`/metrics`, `workwarden.service.metrics`);
- a span per API call when the OpenTelemetry API is installed
  (`workwarden.service.tracing`).

`workwarden serve` runs it on uvicorn; `workwarden.service.client.HttpAuthority`
calls it with `Authority`'s method names; `python -m workwarden.service.adapter`
speaks the conformance protocol through it. `docs/service.md` documents it all.

Importing the package itself imports nothing more, so a process that only
counts (`workwarden.service.metrics` needs `prometheus_client` alone) does
not load the web framework.
"""

__all__: list[str] = []
