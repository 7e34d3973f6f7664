"""`ninfer serve`: an OpenAI- and Anthropic-compatible HTTP server over one `LLM` (the `serve`
extra: FastAPI, uvicorn, prometheus-client).

    app.py            routes, auth, body limit, streaming
    driver.py         the engine side: rendering, validation, jobs as async streams, cancel
    openai_api.py     OpenAI wire models, message conversion, responses and chunks
    anthropic_api.py  Anthropic Messages wire models, block conversion, events
    tool_calls.py     Qwen's reasoning split and XML tool calls, parsed incrementally
    metrics.py        Prometheus metrics (requests, tokens, TTFT, decode, cache_stats)
    run.py            uvicorn start, SIGTERM drain, exit
"""
