"""The gateway's conformance suite with real engines as its pools: `vllm-real` (vLLM 0.32) and
`sglang-real` (SGLang 0.5.23), each one real server serving the tiny model.

The test functions are `tests/gateway/test_conformance.py`'s own, imported here, not copied: only
the `pool` fixture differs (there: simulators). What random weights make impossible to assert, and
what each test asserts instead for a real pool, is in that module's docstring and at each test.
"""

from __future__ import annotations

import pytest

from tests.gateway.test_conformance import *  # noqa: F403  # the same tests, collected again here
from tests.gateway.test_conformance import Pool
from tests.real_engines.servers import EngineServer

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),
]  # the first test may wait for a server's startup


@pytest.fixture(scope="module")
def pool(real_engine: EngineServer) -> Pool:
    return Pool(real_engine.engine, real_url=real_engine.base_url, served=real_engine.served_model_name)
