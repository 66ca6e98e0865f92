"""Every deferred protocol model builds (docs/design/0470): with defer_build a model whose schema
cannot be made no longer fails at import but in the first session that uses it."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest
from pydantic import BaseModel

from corral.protocol import actions, results
from corral.sandbox.tools import transfer_record


def _models(*modules: ModuleType) -> list[type[BaseModel]]:
    return [
        obj
        for module in modules
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, BaseModel) and obj.__module__ == module.__name__
    ]


@pytest.mark.parametrize("model", _models(actions, results, transfer_record), ids=lambda m: m.__qualname__)
def test_every_deferred_model_builds(model: type[BaseModel]) -> None:
    model.model_rebuild(force=True)  # raises what the first use would
    assert model.__pydantic_complete__
    model.model_json_schema()


def test_callers_that_come_during_the_unions_build_share_it() -> None:
    # The controller's warm-up builds it in a thread; a first request may ask meanwhile (0470).
    import threading

    actions.native_action.cache_clear()
    actions._native_action.cache_clear()
    got: list[object] = []
    start = threading.Barrier(2)

    def ask() -> None:
        start.wait()
        got.append(actions.native_action())

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got[0] is got[1]
