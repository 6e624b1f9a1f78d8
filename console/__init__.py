"""`pocketmq console`: the web console (needs the `console` extra: starlette, uvicorn, jinja2,
python-multipart).

    logic.py    the rules, sans-IO: lag, lag history, reset preview, scan bounds, pages, cache
    auth.py     users file, password hashes, session cookies, CSRF tokens (sans-IO)
    data.py     what the pages show, fetched through mqadmin's AdminSession (the client's ClientAPI)
    streams.py  live tail (SSE) and content search: bounded, cancellable reads
    app.py      the Starlette routes and the write checks; templates/ and static/ (vendored
                htmx and uPlot: nothing is fetched from a CDN)
    server.py   uvicorn on the caller's asyncio loop
"""
