"""``cmr dashboard``: a local web page of the jobs in a store, read from the store alone.

    board.py    the read model: the job list (paged), one job's detail, the workers seen;
                a finished, cleaned-up job never changes, so it is read once and kept
    server.py   the ASGI app (Starlette) serving the page and its JSON API, run by uvicorn
    static/     the page: one HTML file, its script and style, and Chart.js (vendored, so
                the page works offline: static/vendor/README.md says where it came from)

Like ``cmr status`` it only reads: it works beside any fleet, and stopping it changes
nothing. Everything it shows came from the table, strangers' data: the read model checks
each field it uses, and the page puts every string into text, never into markup.
"""
