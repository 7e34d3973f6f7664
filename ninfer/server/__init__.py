"""`ninfer serve`: an OpenAI- and Anthropic-compatible HTTP server over one `LLM` (the `serve`
extra: FastAPI, uvicorn, prometheus-client).

    app.py              the app: routers, error shapes, health, metrics
    guard.py            the gate: Host, Origin (CORS), API key, drain, content type; 500s
    context.py          what the routes share: driver, metrics, body parsing, SSE, disconnects
    openai_routes.py    /v1/chat/completions, /v1/completions, /v1/models
    anthropic_routes.py /v1/messages, /v1/messages/count_tokens
    driver.py           the engine side: rendering, validation, jobs as batched async streams
    openai_api.py       OpenAI wire models, message conversion, responses and chunks
    anthropic_api.py    Anthropic Messages wire models, block conversion, events
    tool_calls.py       Qwen's reasoning split and XML tool calls, parsed incrementally
    metrics.py          Prometheus metrics (requests, tokens, TTFT, decode, cache_stats)
    run.py              uvicorn start, SIGTERM drain, exit
"""
