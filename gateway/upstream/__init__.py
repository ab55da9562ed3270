"""The upstream: everything between the route decision and the engine's bytes.

The one narrow transport interface and its implementation (raw HTTP/1.1 on asyncio), the proxy stage
(failover before the first byte, the retry budget), the SSE relay (engine events → the neutral events of
`engines` → OpenAI's bytes), active health probes and load scraping, and their settings.
"""
