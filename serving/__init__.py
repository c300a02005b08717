"""Serving: a model at any level behind OpenAI's HTTP API (``ladder serve``).

``engine.py`` decodes requests (each with its own sampling settings and limits) on
a worker thread, several together (continuous batching over the model's plain pass,
``model.transformer(ids, positions, cache)``, with positions it keeps and a paged KV
cache whose blocks requests take and give back as they come and go);
``api.py`` is the HTTP side on starlette (``POST /v1/chat/completions``, ``/v1/completions``,
``GET /v1/models``, ``/health``), served by uvicorn, bound to 127.0.0.1 unless told
otherwise. ``ladder/serve.py`` is the command. The chapter is docs/serving.md.
"""
