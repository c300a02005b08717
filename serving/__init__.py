"""Serving: a model at any level behind OpenAI's HTTP API (``ladder serve``), in front of
the engine (the top-level ``engine`` package, which decodes).

``worker.py`` runs the engine on a worker thread with a queue in front, and hands each
completion's text and ending to its caller as they come; ``api.py`` is the HTTP side on
starlette (``POST /v1/chat/completions``, ``/v1/completions``, ``GET /v1/models``,
``/health``, ``/metrics``, the chat page), served by uvicorn, bound to 127.0.0.1 unless
told otherwise; ``structured.py`` turns ``response_format`` into a constraint,
``metrics.py`` counts, ``launch.py`` starts a server process (the tests, the bench).
``ladder/serve.py`` is the command. The chapter is docs/serving.md.
"""
