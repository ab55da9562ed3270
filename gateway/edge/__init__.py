"""The ASGI edge: what happens between the client's socket and the app.

uvicorn's httptools protocol with our request cycle (one write per JSON answer, a disconnect callback),
the request-head guard (size and time limits), the request id, and their settings. The root's
`gateway/server.py` runs uvicorn with them.
"""
