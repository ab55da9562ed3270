from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policies.load import LoadModel
from policies.types import BackendView


def test_score_combines_active_queue_and_kv() -> None:
    model = LoadModel(queue_weight=2.0, kv_weight=4.0)
    assert model.score(BackendView("a")) == 0.0
    assert model.score(BackendView("a", in_flight=3)) == 3.0
    # the engine's count (all replicas) beats this replica's in-flight when larger
    assert model.score(BackendView("a", in_flight=3, running=5.0)) == 5.0
    assert model.score(BackendView("a", in_flight=3, running=1.0)) == 3.0
    # the engine's queue is part of the engine's count: running + queue_weight * queue
    assert model.score(BackendView("a", in_flight=1, running=1.0, queue_depth=2.0, kv_usage=0.5)) == 1 + 4 + 2
    assert model.score(BackendView("a", in_flight=1, queue_depth=2.0)) == 4.0


def test_queued_requests_of_this_replica_are_not_counted_twice() -> None:
    """One replica sent 5 requests; the engine runs 1 and queues 4: that is a load of 5, not 9."""
    model = LoadModel()
    assert model.score(BackendView("a", in_flight=5, running=1.0, queue_depth=4.0)) == 5.0
    # other replicas' requests show up in the engine's figures
    assert model.score(BackendView("a", in_flight=2, running=1.0, queue_depth=6.0)) == 7.0


def test_unknown_engine_metrics_count_as_zero() -> None:
    assert LoadModel().score(BackendView("a", in_flight=2, queue_depth=None, kv_usage=None)) == 2.0


def test_saturation_thresholds() -> None:
    model = LoadModel(queue_high=4.0, kv_high=0.9)
    assert not model.saturated(BackendView("a", queue_depth=4.0, kv_usage=0.9))
    assert model.saturated(BackendView("a", queue_depth=4.5))
    assert model.saturated(BackendView("a", kv_usage=0.91))
    assert model.saturated(BackendView("a", in_flight=8, max_concurrency=8))
    assert not model.saturated(BackendView("a", in_flight=7, max_concurrency=8))
    off = LoadModel(queue_high=None, kv_high=None)
    assert not off.saturated(BackendView("a", queue_depth=1e9, kv_usage=1.0))


def _views(figures: float, limits: bool) -> st.SearchStrategy[list[BackendView]]:
    """Up to 10 backends: in-flight counts and engine figures up to `figures`, KV use in [0, 1],
    and a concurrency limit when `limits`."""
    return st.lists(
        st.builds(
            BackendView,
            name=st.text(min_size=1, max_size=3),
            in_flight=st.integers(0, int(figures)),
            queue_depth=st.none() | st.floats(0, figures),
            running=st.none() | st.floats(0, figures),
            kv_usage=st.none() | st.floats(0, 1),
            max_concurrency=st.none() | st.integers(1, 20) if limits else st.none(),
        ),
        max_size=10,
    )


@given(
    _views(50, limits=False),
    st.floats(0, 4),
    st.floats(0, 8),
)
def test_scores_are_score_of_each(backends: list[BackendView], queue_weight: float, kv_weight: float) -> None:
    model = LoadModel(queue_weight=queue_weight, kv_weight=kv_weight)
    assert model.scores(backends) == [model.score(b) for b in backends]


@given(
    st.lists(
        st.builds(
            BackendView,
            name=st.text(min_size=1, max_size=3),
            in_flight=st.integers(0, 20),
            queue_depth=st.none() | st.integers(0, 12).map(float),
            running=st.none() | st.integers(0, 12).map(float),
            kv_usage=st.none() | st.sampled_from([0.0, 0.5, 0.9, 1.0]),
            max_concurrency=st.none() | st.integers(1, 20),
        ),
        max_size=10,
    ),
    st.integers(0, 30).map(float),
    st.none() | st.integers(0, 10).map(float),
    st.none() | st.sampled_from([0.5, 0.9]),
)
def test_fits_is_within_the_bound_and_not_saturated(
    backends: list[BackendView], bound: float, queue_high: float | None, kv_high: float | None
) -> None:
    model = LoadModel(queue_high=queue_high, kv_high=kv_high)
    scores = model.scores(backends)
    assert model.fits(backends, scores, bound) == [
        s + 1.0 <= bound and not model.saturated(b) for s, b in zip(scores, backends, strict=True)
    ]


@given(
    _views(12, limits=True),
    st.floats(0, 4),
    st.floats(0, 8),
    st.none() | st.integers(0, 10).map(float),
    st.none() | st.sampled_from([0.5, 0.9]),
)
def test_loads_are_the_scores_and_whether_any_is_saturated(
    backends: list[BackendView],
    queue_weight: float,
    kv_weight: float,
    queue_high: float | None,
    kv_high: float | None,
) -> None:
    model = LoadModel(queue_weight=queue_weight, kv_weight=kv_weight, queue_high=queue_high, kv_high=kv_high)
    assert model.loads(backends) == (model.scores(backends), any(model.saturated(b) for b in backends))
